"""Attention backends. Each prepares once per forward what every layer shares (``prepare``), then attends q, k, v
shaped (batch, heads, length, head_dim), k and v possibly carrying fewer (grouped) heads.

- ``flex``: compiled FlexAttention with the stack as ``score_mod`` and a ``block_mask`` (masked blocks are
  skipped). The GPU path; on CPU it runs forward only, as PyTorch implements no FlexAttention backward there.
- ``sdpa``: ``scaled_dot_product_attention`` with the bias as an additive mask, attended in causal query blocks
  (``SdpaBias``). A stack that is not additive (soft caps) cannot be a mask: ``select_backend`` gives it
  ``BlockedEager`` instead, the same causal blocks with explicit logits.
- ``eager``: explicit logits and softmax in a chosen dtype over the whole square; the weights pass through an
  ``AttentionWeights`` module so hooks (published-model probes, the underflow monitor) can read them.

What does not change between steps is cached per (length, device, dtype): block masks, and the bias of stacks
without trainable parameters. Stacks with learnable slopes rebuild their bias every forward.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from blindheads.modules.gradient_floor import floored_gradient_softmax
from blindheads.modules.position.base import PositionStack

Backend = Literal["auto", "flex", "sdpa", "eager"]
BACKENDS = get_args(Backend)
SDPA_BIAS_BUDGET = 2**27  # elements of bias (512 MiB in float32) before the bias is built block by block
SDPA_QUERY_BLOCK = 128  # queries per block: each block attends only to the keys it may see


def resolve_backend(name: str, device: torch.device) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; valid: {', '.join(BACKENDS)}")
    if name == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return name


class AttentionWeights(nn.Module):
    """The softmax of the eager backend, as a module so forward hooks see its logits and the weights it returns.

    It computes in ``dtype`` (the model's ``softmax_dtype``; a forward may ask for another, e.g. what a training
    precision computes in) even under autocast (which would otherwise run softmax in float32), since which weights
    end up exactly zero is what the dtype decides. With ``gradient_floor`` (nats) its backward pass sees every
    visible weight at least ``e^-gradient_floor`` of its row's largest; its forward pass is the same.
    """

    def __init__(self, dtype: torch.dtype = torch.float32, gradient_floor: float | None = None) -> None:
        super().__init__()
        self.dtype, self.gradient_floor = dtype, gradient_floor

    def forward(self, logits: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        return softmax_in(logits, dtype or self.dtype, self.gradient_floor)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}" + (
            "" if self.gradient_floor is None else f", gradient_floor={self.gradient_floor}"
        )


def softmax_in(logits: Tensor, dtype: torch.dtype, gradient_floor: float | None = None) -> Tensor:
    with torch.autocast(logits.device.type, enabled=False):
        if gradient_floor is not None and torch.is_grad_enabled() and logits.requires_grad:
            return floored_gradient_softmax(logits.to(dtype), gradient_floor)
        return torch.softmax(logits.to(dtype), dim=-1)


def _expand_kv(q: Tensor, kv: Tensor) -> Tensor:
    return kv.repeat_interleave(q.shape[1] // kv.shape[1], dim=1)


def _logits(q: Tensor, k: Tensor, stack: PositionStack, dtype: torch.dtype, q_end: int, kv_start: int = 0) -> Tensor:
    """Masked logits of queries ending at position ``q_end`` against keys ``kv_start .. kv_start + len(k) - 1``."""
    scores = (q @ k.transpose(-2, -1)).to(dtype) / math.sqrt(q.shape[-1])
    h, q_idx, kv_idx = stack.index_grid(q.shape[-2], q_end, q.device, kv_len=kv_start + k.shape[-2])
    kv_idx = kv_idx[..., kv_start:]
    logits = stack.score_mod(scores, None, h, q_idx, kv_idx)
    return logits.masked_fill(~stack.mask_mod(None, h, q_idx, kv_idx), -math.inf)


def eager_attention(
    q: Tensor, k: Tensor, v: Tensor, stack: PositionStack, weights: AttentionWeights, dtype: torch.dtype | None = None
) -> Tensor:
    """Explicit logits and softmax (in ``dtype``, else the weights module's own), through ``weights`` so forward
    hooks see them."""
    k, v = _expand_kv(q, k), _expand_kv(q, v)
    dtype = dtype or weights.dtype
    return weights(_logits(q, k, stack, dtype, k.shape[-2]), dtype).to(v.dtype) @ v


class CausalBlocks:
    """Query blocks of one forward: ``(start, stop, first)`` attends queries ``start..stop-1`` to keys
    ``first..stop-1``, skipping the causal upper triangle and, with a sliding window, the keys no query of the
    block still sees. About half the work of the whole square, with the same result."""

    def __init__(self, stack: PositionStack, length: int, block: int) -> None:
        self.length, self.block, self.window = length, max(1, block), stack.window()

    def __iter__(self):
        for start in range(0, self.length, self.block):
            first = 0 if math.isinf(self.window) else max(0, start - int(self.window) + 1)
            yield start, min(start + self.block, self.length), first


class SdpaBias(CausalBlocks):
    """The additive bias of one forward pass, shared by every layer, handed out by query block. Up to
    ``SDPA_BIAS_BUDGET`` elements it is built once (in ``dtype``) and sliced; beyond (long evaluations), each
    block's rows are built when needed, so memory stays bounded by the budget instead of growing with length
    squared."""

    def __init__(self, stack: PositionStack, length: int, device: torch.device, dtype: torch.dtype = torch.float32):
        super().__init__(stack, length, min(SDPA_QUERY_BLOCK, SDPA_BIAS_BUDGET // (stack.num_heads * length)))
        self.stack, self.device, self.dtype = stack, device, dtype
        small = stack.num_heads * length**2 <= SDPA_BIAS_BUDGET
        self.whole = stack.dense_bias(length, length, device).to(dtype) if small else None

    def rows(self, start: int, stop: int, first: int) -> Tensor:
        """Bias of queries ``start..stop-1`` against keys ``first..stop-1``, (heads, stop - start, stop - first)."""
        if self.whole is not None:
            return self.whole[:, start:stop, first:stop]
        return self.stack.dense_bias(stop - start, stop, self.device)[..., first:].to(self.dtype)


def _join(blocks: list[Tensor]) -> Tensor:
    """Per-block outputs back in query order."""
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-2)


class AttentionBackend:
    """Prepare once per forward, then attend in every layer."""

    def prepare(self, stack: PositionStack, length: int, device: torch.device, dtype: torch.dtype) -> None:
        """Build (or take from the cache) what every layer of this forward shares."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, stack: PositionStack, weights: AttentionWeights) -> Tensor:
        raise NotImplementedError


class _Cached(AttentionBackend):
    """Keeps the last prepared value per (length, device, dtype, the stack's buffers); rebuilt every forward for
    stacks with trainable parameters."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.prepared: Any = None  # what ``build`` returns: a bias, a block mask...

    def build(self, stack: PositionStack, length: int, device: torch.device, dtype: torch.dtype):
        raise NotImplementedError

    def prepare(self, stack, length, device, dtype) -> None:
        # the buffers' identity and version: a loaded state dict or a move invalidates the cache
        buffers = tuple((b.data_ptr(), b._version) for b in stack.buffers())
        key = (length, torch.device(device), dtype, buffers)
        if key != self.key or any(p.requires_grad for p in stack.parameters()):
            self.key, self.prepared = key, self.build(stack, length, device, dtype)


class Eager(AttentionBackend):
    """Every weight materialized; ``softmax_dtype`` overrides the model's softmax dtype for this backend's calls."""

    def __init__(self, softmax_dtype: torch.dtype | None = None) -> None:
        self.softmax_dtype = softmax_dtype

    def attend(self, q, k, v, stack, weights):
        return eager_attention(q, k, v, stack, weights, self.softmax_dtype)


class Sdpa(_Cached):
    def build(self, stack, length, device, dtype):
        return None if stack.is_causal_only else SdpaBias(stack, length, device, dtype)

    def attend(self, q, k, v, stack, weights):
        bias = self.prepared
        if bias is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return _join(
            [
                F.scaled_dot_product_attention(
                    q[..., start:stop, :],
                    k[..., first:stop, :],
                    v[..., first:stop, :],
                    attn_mask=bias.rows(start, stop, first),
                    enable_gqa=True,
                )
                for start, stop, first in bias
            ]
        )


class BlockedEager(AttentionBackend):
    """Stacks SDPA cannot take as a mask (soft caps): explicit logits and softmax in causal query blocks."""

    def prepare(self, stack, length, device, dtype) -> None:
        self.blocks = CausalBlocks(stack, length, SDPA_QUERY_BLOCK)

    def attend(self, q, k, v, stack, weights):
        k, v = _expand_kv(q, k), _expand_kv(q, v)
        return _join(
            [
                softmax_in(
                    _logits(q[..., start:stop, :], k[..., first:stop, :], stack, weights.dtype, stop, first),
                    weights.dtype,
                ).to(v.dtype)
                @ v[..., first:stop, :]
                for start, stop, first in self.blocks
            ]
        )


class Flex(_Cached):
    def build(self, stack, length, device, dtype):
        return flex_block_mask(stack, length, device)

    def attend(self, q, k, v, stack, weights):
        def score_mod(score, b, h, q_idx, kv_idx):
            return stack.score_mod(score, b, h, q_idx, kv_idx)

        return compiled_flex_attention()(q, k, v, score_mod=score_mod, block_mask=self.prepared, enable_gqa=True)


def select_backend(name: str, stack: PositionStack, device: torch.device) -> type[AttentionBackend]:
    """The one place that decides which kernel runs: ``auto`` resolved for the device, and ``sdpa`` replaced by
    ``BlockedEager`` for stacks that are not additive."""
    name = resolve_backend(name, device)
    if name == "sdpa" and not stack.is_additive:
        return BlockedEager
    return {"flex": Flex, "sdpa": Sdpa, "eager": Eager}[name]


@lru_cache(maxsize=1)
def compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(stack: PositionStack, length: int, device: torch.device) -> BlockMask:
    # FlexAttention tells mask_mod from score_mod by counting arguments: pass plain functions, not bound methods.
    def mask_mod(b, h, q_idx, kv_idx):
        return stack.mask_mod(b, h, q_idx, kv_idx)

    return create_block_mask(mask_mod, None, None, length, length, device=device)
