"""ALiBi slope schemes: the published ones, and ones chosen by where each head should go blind.

Slopes are computed on the CPU in float64 (also under a ``meta`` or CUDA default device), then moved with the model.

For a power-of-two head count, Press and MPT slopes fall from head 0 (the steepest, the shortest blindness
distance) to the last head. Otherwise both append the interleaved extra slopes after the first power of two, so a
later head can be the steepest: with 9 heads, head 8 (0.707) is steeper than head 0 (0.5). The presets chosen by
blindness distance (steep, safe, wide, robust) always go from the shortest distance at head 0 to the longest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from blindheads.modules.position.base import finite_range, used_in
from blindheads.numerics import tau

# Blindness-distance presets: name -> function(num_heads, context_length) -> distances in tokens.
BLIND_DISTANCE_PRESETS = {
    "steep": lambda n, context: _geometric(128, 512, n),
    "safe": lambda n, context: _geometric(2048, 4096, n),
    "wide": lambda n, context: 2.0 ** torch.linspace(4, 12, n, dtype=torch.float64, device="cpu").round(),
    "robust": lambda n, context: context * torch.arange(1, n + 1, dtype=torch.float64, device="cpu") / n,
}
SCHEMES = ("press", "mpt", *BLIND_DISTANCE_PRESETS)


def _geometric(low: float, high: float, n: int) -> Tensor:
    return torch.logspace(math.log10(low), math.log10(high), n, dtype=torch.float64, device="cpu")


def press_slopes(num_heads: int) -> Tensor:
    """Press et al.: ``r^1..r^n`` with ``r = 2^(-8/n)`` for a power of two ``n``; otherwise the slopes of the
    closest smaller power of two ``p``, then every other slope of ``2p`` heads, as the original code interleaves."""

    def power_of_two(n: int) -> list[float]:
        ratio = 2.0 ** (-8.0 / n)
        return [ratio ** (i + 1) for i in range(n)]

    p = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(p) + power_of_two(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float64, device="cpu")


def mpt_slopes(num_heads: int, alibi_bias_max: float = 8.0) -> Tensor:
    """MPT: ``1 / 2^(k * alibi_bias_max / n')`` for ``k = 1..n'`` with ``n'`` the next power of two, odd positions
    first when ``n' != n``. ``alibi_bias_max`` is an exponent range (8 gives Press's slopes), not a clamp.

    This is all MPT does to the bias: llm-foundry's ``build_alibi_bias`` and transformers' ``build_mpt_alibi_tensor``
    multiply these slopes by key positions ``1 - L .. 0`` (equal to ``-m * d`` after the softmax) and never clamp
    it. The only limit is ``max_seq_len``: the bias is built for that many keys and longer inputs are refused."""
    padded = 2 ** math.ceil(math.log2(num_heads))
    slopes = 1.0 / 2.0 ** (torch.arange(1, padded + 1, dtype=torch.float64, device="cpu") * (alibi_bias_max / padded))
    if padded != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def slopes_for_blind_distances(
    distances: Tensor | Sequence[float], dtype: str = "bfloat16", threshold: str = "normal"
) -> Tensor:
    """Slopes ``tau / D_h`` that make head h go blind exactly ``D_h`` tokens back (linear distances)."""
    distances = torch.as_tensor(distances, dtype=torch.float64, device="cpu")
    if (distances <= 0).any():
        raise ValueError(f"blindness distances must be positive, got {distances.tolist()}")
    return tau(dtype, threshold) / distances


def resolve_slopes(
    scheme: str | list[float],
    num_heads: int,
    context_length: int,
    *,
    alibi_bias_max: float = 8.0,
    blind_distances: list[float] | None = None,
    dtype: str = "bfloat16",
    threshold: str = "normal",
) -> Tensor:
    """Slopes (float64, one per head) for a scheme name, an explicit list, or explicit blindness distances."""
    if blind_distances is not None:
        slopes = slopes_for_blind_distances(blind_distances, dtype, threshold)
    elif isinstance(scheme, str):
        if scheme == "press":
            slopes = press_slopes(num_heads)
        elif scheme == "mpt":
            slopes = mpt_slopes(num_heads, alibi_bias_max)
        elif scheme in BLIND_DISTANCE_PRESETS:
            slopes = slopes_for_blind_distances(
                BLIND_DISTANCE_PRESETS[scheme](num_heads, context_length), dtype, threshold
            )
        else:
            raise ValueError(f"unknown ALiBi slope scheme {scheme!r}; valid: {', '.join(SCHEMES)} or a list of slopes")
    else:
        slopes = torch.tensor([float(s) for s in scheme], dtype=torch.float64, device="cpu")
    if slopes.numel() != num_heads:
        raise ValueError(f"ALiBi got {slopes.numel()} slopes for {num_heads} heads: give exactly one per head")
    if not ((slopes > 0) & torch.isfinite(slopes)).all():
        raise ValueError(f"ALiBi slopes must be positive and finite, got {slopes.tolist()}")
    for where in used_in(dtype):  # a slope of inf where it is used makes the bias at the key itself -inf * 0 = nan
        narrow = slopes.to(where)
        if not (torch.isfinite(narrow) & (narrow > 0)).all():
            made = f" (from blind_distances {list(blind_distances)})" if blind_distances is not None else ""
            raise ValueError(f"ALiBi slopes must be positive and finite in {finite_range(where, positive=True)}, got "
                             f"{slopes.tolist()}{made}")  # fmt: skip
    return slopes
