"""Attention kernels. Each takes q, k, v shaped (batch, heads, length, head_dim) with k and v possibly carrying
fewer (grouped) heads, and the position stack that builds the logits.

- ``flex``: compiled FlexAttention with the stack as ``score_mod`` and a cached ``block_mask`` (masked blocks are
  skipped). The GPU path; on CPU it runs forward only, as PyTorch implements no FlexAttention backward there.
- ``sdpa``: ``scaled_dot_product_attention`` with the bias materialised as an additive mask once per forward and
  shared by all layers, attended in causal query blocks (``SdpaBias``). Soft caps are not additive, so with one in
  the stack this backend computes like ``eager``.
- ``eager``: explicit logits and softmax in a chosen dtype; the weights pass through an ``AttentionWeights`` module
  so hooks (probes, the underflow monitor) can read them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from blindheads.modules.position.base import PositionStack

BACKENDS = ("auto", "flex", "sdpa", "eager")


def resolve_backend(name: str, device: torch.device) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; valid: {', '.join(BACKENDS)}")
    if name == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return name


class AttentionWeights(nn.Module):
    """The softmax of the eager backend, as a module so forward hooks see its logits and the weights it returns.

    It computes in ``dtype`` even under autocast (which would otherwise run softmax in float32), since which
    weights end up exactly zero is what the dtype decides.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, logits: Tensor) -> Tensor:
        with torch.autocast(logits.device.type, enabled=False):
            return torch.softmax(logits.to(self.dtype), dim=-1)


def _expand_kv(q: Tensor, kv: Tensor) -> Tensor:
    return kv.repeat_interleave(q.shape[1] // kv.shape[1], dim=1)


def eager_attention(q: Tensor, k: Tensor, v: Tensor, stack: PositionStack, weights: AttentionWeights) -> Tensor:
    k, v = _expand_kv(q, k), _expand_kv(q, v)
    scores = (q @ k.transpose(-2, -1)).to(weights.dtype) / math.sqrt(q.shape[-1])
    h, q_idx, kv_idx = stack.index_grid(q.shape[-2], k.shape[-2], q.device)
    logits = stack.score_mod(scores, None, h, q_idx, kv_idx)
    logits = logits.masked_fill(~stack.mask_mod(None, h, q_idx, kv_idx), -math.inf)
    return weights(logits).to(v.dtype) @ v


SDPA_BIAS_BUDGET = 2**27  # elements of bias (512 MiB in float32) before the bias is built block by block
SDPA_QUERY_BLOCK = 256  # queries per SDPA call: each block attends only to the keys it may see


class SdpaBias:
    """The additive bias of one forward pass, shared by every layer, handed out by query block.

    SDPA with a mask cannot skip the causal upper triangle, so each layer attends in blocks of
    ``SDPA_QUERY_BLOCK`` queries against keys up to the block's end (and, with a sliding window, from the first
    key the block's first query still sees): about half the work of the full square, with the same result. Up to
    ``SDPA_BIAS_BUDGET`` elements the bias is built once and sliced; beyond (long evaluations), each block's rows
    are built when needed, so memory stays bounded by the budget instead of growing with length squared."""

    def __init__(self, stack: PositionStack, length: int, device: torch.device) -> None:
        self.stack, self.length, self.device = stack, length, device
        self.block = max(1, min(SDPA_QUERY_BLOCK, SDPA_BIAS_BUDGET // (stack.num_heads * length)))
        self.window = stack.window()
        self.whole = stack.dense_bias(length, length, device) if stack.num_heads * length**2 <= SDPA_BIAS_BUDGET else None

    def blocks(self):
        """``(start, stop, first)``: queries ``start..stop-1`` attend to keys ``first..stop-1``."""
        for start in range(0, self.length, self.block):
            first = 0 if math.isinf(self.window) else max(0, start - int(self.window) + 1)
            yield start, min(start + self.block, self.length), first

    def rows(self, start: int, stop: int, first: int) -> Tensor:
        """Bias of queries ``start..stop-1`` against keys ``first..stop-1``, (heads, stop - start, stop - first)."""
        if self.whole is not None:
            return self.whole[:, start:stop, first:stop]
        return self.stack.dense_bias(stop - start, stop, self.device)[..., first:]


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: SdpaBias | None) -> Tensor:
    """``bias`` is ``None`` when the stack needs only causality."""
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    outputs = [
        F.scaled_dot_product_attention(q[..., start:stop, :], k[..., first:stop, :], v[..., first:stop, :],
                                       attn_mask=bias.rows(start, stop, first).to(q.dtype), enable_gqa=True)
        for start, stop, first in bias.blocks()
    ]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-2)


@lru_cache(maxsize=1)
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(stack: PositionStack, length: int, device: torch.device) -> BlockMask:
    # FlexAttention tells mask_mod from score_mod by counting arguments: pass plain functions, not bound methods.
    def mask_mod(b, h, q_idx, kv_idx):
        return stack.mask_mod(b, h, q_idx, kv_idx)

    return create_block_mask(mask_mod, None, None, length, length, device=device)


def flex(q: Tensor, k: Tensor, v: Tensor, stack: PositionStack, block_mask: BlockMask) -> Tensor:
    def score_mod(score, b, h, q_idx, kv_idx):
        return stack.score_mod(score, b, h, q_idx, kv_idx)

    return _compiled_flex_attention()(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True)
