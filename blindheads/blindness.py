"""When does a head go blind? The underflow threshold of a softmax and each head's blindness distance.

A softmax weight ``exp(x - max) / Z`` is exactly zero once the logit gap passes ``tau = -ln(smallest value
kept)``. A head whose bias-only logit falls below ``-tau`` at distance ``D`` sees nothing from ``D`` tokens back:
no weight and no gradient reaches those keys.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from blindheads.modules.position.base import PositionStack

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
THRESHOLDS = ("normal", "subnormal")
BACKENDS = ("eager", "sdpa")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A supported floating dtype from its name (``"bfloat16"``) or itself."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ValueError(f"unsupported dtype {dtype!r}; valid: {', '.join(DTYPES)}")


def tau(dtype: str | torch.dtype, threshold: str = "normal") -> float:
    """The logit gap beyond which a softmax weight is exactly zero: ``-ln(smallest weight kept)``.

    ``normal``: the smallest kept weight is the smallest normal number; flush-to-zero kernels (fused GPU attention)
    drop everything below it. ``subnormal``: it is half the smallest subnormal number, below which round-to-nearest
    gives zero, as in a kernel that keeps subnormals (most CPU softmaxes). Computed in logs: float64's smallest
    subnormal is itself below what a Python float can hold halved.
    """
    info = torch.finfo(resolve_dtype(dtype))
    if threshold == "normal":
        return -math.log(info.tiny)
    if threshold == "subnormal":
        return -math.log(info.tiny) - math.log(info.eps) + math.log(2)
    raise ValueError(f"unknown threshold mode {threshold!r}; valid: {', '.join(THRESHOLDS)}")


@contextmanager
def flushing_subnormals():
    """Make CPU float32/float64 arithmetic flush subnormals to zero, as fused GPU kernels do (``normal`` mode).

    float16 and bfloat16 results are converted from float32 and keep their subnormals either way. The flag is per
    thread (and inherited by threads started under it), so the block runs single-threaded.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if not torch.set_flush_denormal(True):
        torch.set_num_threads(threads)
        raise RuntimeError("this CPU cannot flush subnormals to zero")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _two_key_weight(gap: float, dtype: torch.dtype, device: torch.device, backend: str) -> float:
    """The weight a softmax gives the key ``gap`` below the other, computed the way ``backend`` computes it."""
    logits = torch.tensor([0.0, -gap], dtype=torch.float64, device=device).to(dtype)
    if backend == "eager":
        return torch.softmax(logits, dim=-1)[1].item()
    if backend == "sdpa":
        # q = k = 0, so the weights are the additive mask's softmax; v = identity returns them.
        q = torch.zeros(1, 1, 1, 8, dtype=dtype, device=device)
        k = torch.zeros(1, 1, 2, 8, dtype=dtype, device=device)
        v = torch.eye(2, 8, dtype=dtype, device=device)[None, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=logits.view(1, 1, 1, 2))[0, 0, 0, 1].item()
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def measure_tau(dtype: str | torch.dtype, device: str = "cpu", backend: str = "eager", iterations: int = 60) -> float:
    """The smallest logit gap at which this device, backend and dtype's softmax returns an exact zero.

    Compare with ``tau(dtype, "normal")`` (flush-to-zero) and ``tau(dtype, "subnormal")`` (subnormals kept). The
    gap is rounded to ``dtype`` before the softmax, so for bfloat16 and float16 it is resolved to their precision.
    """
    dtype, device = resolve_dtype(dtype), torch.device(device)
    sighted, blind = 0.0, 2 * tau(dtype, "subnormal")
    if _two_key_weight(blind, dtype, device, backend) != 0.0:
        raise RuntimeError(f"{backend} softmax in {dtype} on {device} never returned an exact zero")
    for _ in range(iterations):
        middle = (sighted + blind) / 2
        if _two_key_weight(middle, dtype, device, backend) == 0.0:
            blind = middle
        else:
            sighted = middle
    return blind


def blind_distances(stack: PositionStack, tau: float | Tensor, search: bool = False) -> Tensor:
    """Per head, the distance beyond which the bias-only logit is below ``-tau``; ``inf`` for a head never blind.

    Closed form (inverting each stage: linear and log distances, clamps, soft caps) unless a component has no
    inverse or ``search=True``; then a bisection on the monotone bias. A sliding window caps the result.
    ``tau`` may be one value or one per head (to subtract each head's ``ln Z``).
    """
    target = -torch.as_tensor(tau, dtype=torch.float64)
    if not search:
        try:
            distances = stack.inverse_bias_logit(target)
        except NotImplementedError:
            search = True
    if search:
        distances = _search_blind_distances(stack, target.expand(stack.num_heads))
    return distances.clamp_max(stack.window()).clamp_min(0)


def _bias_only_logit(stack: PositionStack, d: Tensor) -> Tensor:
    h = torch.arange(stack.num_heads)[:, None].expand_as(d)
    return stack.logit(torch.zeros((), dtype=torch.float64), stack.bias_of_distance(d, h))


@torch.no_grad()
def _search_blind_distances(stack: PositionStack, target: Tensor, steps: int = 200) -> Tensor:
    """Bisection on ``u = ln(1 + d)``, so one search covers every distance a float64 can hold."""
    low = torch.zeros(stack.num_heads, 1, dtype=torch.float64)
    high = torch.full_like(low, math.log(torch.finfo(torch.float64).max))
    reachable = _bias_only_logit(stack, high.expm1())[:, 0] < target
    for _ in range(steps):
        middle = (low + high) / 2
        below = _bias_only_logit(stack, middle.expm1()) < target[:, None]
        high = torch.where(below, middle, high)
        low = torch.where(below, low, middle)
    return torch.where(reachable, high[:, 0].expm1(), torch.full_like(high[:, 0], math.inf))


def first_blind_token(distance: Tensor) -> Tensor:
    """The first integer distance at or beyond a (continuous) blindness distance."""
    return torch.ceil(distance)


def underflow_last_query(distance: Tensor, context: int) -> Tensor:
    """Share of the last query's ``context`` keys (distances 0..L-1) that are blind, per head."""
    blind = (context - first_blind_token(distance)).clamp(min=0, max=context)
    return blind / context


def underflow_all_pairs(distance: Tensor, context: int) -> Tensor:
    """Share of all ``L(L+1)/2`` causal query-key pairs of an ``L``-token sequence that are blind, per head."""
    count = (context - first_blind_token(distance)).clamp(min=0, max=context)
    return count * (count + 1) / (context * (context + 1))


@dataclass
class HeadBlindness:
    slope: float | None
    blind_distance: float
    underflow_last_query: float
    underflow_all_pairs: float


@dataclass
class BlindnessReport:
    """Per-head blindness of a position stack at one context length, dtype and threshold mode."""

    tau: float
    dtype: str
    threshold: str
    context: int
    heads: list[HeadBlindness]
    underflow_last_query: float
    underflow_all_pairs: float

    def to_dict(self) -> dict:
        return asdict(self)


def blindness_report(stack: PositionStack, context: int, dtype: str = "bfloat16", threshold: str = "normal"):
    """Tau, per-head blindness distances and underflow shares, and their averages over heads."""
    threshold_tau = tau(dtype, threshold)
    distances = blind_distances(stack, threshold_tau)
    last, pairs = underflow_last_query(distances, context), underflow_all_pairs(distances, context)
    slopes = next((c.slopes.tolist() for c in stack if hasattr(c, "slopes")), [None] * stack.num_heads)
    heads = [
        HeadBlindness(slope, float(dist), float(lq), float(ap))
        for slope, dist, lq, ap in zip(slopes, distances, last, pairs)
    ]
    return BlindnessReport(
        tau=threshold_tau,
        dtype=str(resolve_dtype(dtype)).removeprefix("torch."),
        threshold=threshold,
        context=context,
        heads=heads,
        underflow_last_query=float(last.mean()),
        underflow_all_pairs=float(pairs.mean()),
    )
