"""Reduce causal attention weights to where they are exactly zero, and where they are past the learning horizon
(below ``e^-H`` of their row's largest), per head, one layer at a time.

Used by the underflow monitor on models being trained and by the probes of published models: each layer's
weights (batch, heads, L, L), queries at positions 0..L-1 over keys 0..i, are reduced as they are produced, so
memory never holds more than one layer's attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from blindheads.numerics import LEARNING_HORIZON, check_horizon


@dataclass
class ZeroStatistics:
    """Per head: exact zeros, weights past the learning horizon and causal pairs by distance, and the farthest
    distance with a non-zero weight."""

    zeros_by_distance: Tensor  # (heads, L) float64
    pairs_by_distance: Tensor  # (L,) float64
    farthest_nonzero: Tensor  # (heads,) long
    deaf_by_distance: Tensor  # (heads, L) float64: weights below e^-horizon of their row's largest (zeros included)
    horizon: float = LEARNING_HORIZON

    @property
    def zero_share(self) -> Tensor:
        """Share of all causal weights that are exactly zero, per head."""
        return self.zeros_by_distance.sum(-1) / self.pairs_by_distance.sum()

    @property
    def deaf_share(self) -> Tensor:
        """Share of all causal weights below ``e^-horizon`` of their row's largest (a relative weight, exact zeros
        included), per head: keys the head does not learn to read."""
        return self.deaf_by_distance.sum(-1) / self.pairs_by_distance.sum()

    @property
    def blind_distance(self) -> Tensor:
        """Smallest distance from which every weight is zero; ``inf`` where the measured batch had none that far back."""
        return _blind_distance(self.farthest_nonzero, len(self.pairs_by_distance))


def mean_zero_share_by_distance(layers: list[ZeroStatistics]) -> Tensor:
    """Per head and distance, the share of weights exactly zero, averaged over layers: (heads, L) float64."""
    return torch.stack([s.zeros_by_distance for s in layers]).mean(0) / layers[0].pairs_by_distance


def _blind_distance(farthest_nonzero: Tensor, length: int) -> Tensor:
    distance = (farthest_nonzero + 1).double()
    return torch.where(distance < length, distance, torch.full_like(distance, math.inf))


def _farthest_nonzero(nonzero: Tensor) -> Tensor:
    """Per head, the largest distance of a non-zero entry of (batch, heads, L, L) ``nonzero`` (already restricted to
    the entries that count); -1 where there is none."""
    length = nonzero.shape[-1]
    first = nonzero.int().argmax(-1)  # first non-zero key of each query row
    distance = torch.arange(length, device=nonzero.device) - first
    return torch.where(nonzero.any(-1), distance, -1).amax(dim=(0, 2))


def _causal_distances(length: int, device: torch.device) -> tuple[Tensor, Tensor]:
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return j <= i, (i - j).clamp_min(0)


@torch.no_grad()
def zero_statistics(weights: Tensor, horizon: float = LEARNING_HORIZON) -> ZeroStatistics:
    """Reduce causal attention weights (batch, heads, L, L) to ``ZeroStatistics``; ``horizon`` in nats below each
    row's largest weight."""
    batch, heads, length, _ = weights.shape
    causal, distance = _causal_distances(length, weights.device)

    def by_distance(selected: Tensor) -> Tensor:
        counts = torch.zeros(heads, length, dtype=torch.float64, device=weights.device)
        return counts.index_add_(1, distance[causal], (selected & causal).sum(0)[:, causal].double()).cpu()

    # in float64, so the edge is the same whatever the weights' dtype (e^-H of a bfloat16 row max rounds)
    edge = weights.amax(-1, keepdim=True).double() * math.exp(-check_horizon(horizon))
    farthest = _farthest_nonzero((weights != 0) & causal)
    pairs = batch * (length - torch.arange(length, device=weights.device)).double()
    return ZeroStatistics(by_distance(weights == 0), pairs.cpu(), farthest.cpu(), by_distance(weights.double() < edge),
                          float(horizon))  # fmt: skip


@dataclass
class GradientStatistics:
    """Per head, over the keys a query may attend to, in rows with more than one such key (a lone key's logit
    always has zero gradient, whatever its weight):

    - ``zero_given_zero_weight``: share of zero-weight keys whose logit gradient is exactly zero. It is 1 by algebra
      (``dL/dx_j = w_j (g_j - sum_k w_k g_k)``): a check; ``nan`` where no weight is zero.
    - ``zero_given_nonzero_weight``: share of keys with a non-zero weight whose gradient is still exactly zero
      (tiny weights whose products underflow): gradient blindness beyond weight blindness. Each row's largest
      weight is left out: a weight that rounds to 1 has zero gradient by saturation, not blindness.
    - ``grad_blind_distance`` and ``weight_blind_distance``: the distance from which every gradient, and every
      weight, is exactly zero (``inf`` where the measured batch had none that far back).
    """

    zero_given_zero_weight: Tensor
    zero_given_nonzero_weight: Tensor
    grad_blind_distance: Tensor
    weight_blind_distance: Tensor


@torch.no_grad()
def gradient_statistics(logits: Tensor, weights: Tensor, grads: Tensor) -> GradientStatistics:
    """Reduce one layer's softmax logits, weights and logit gradients (batch, heads, L, L)."""
    length = weights.shape[-1]
    counted = torch.isfinite(logits) & (torch.isfinite(logits).sum(-1, keepdim=True) > 1)
    zero_weight, zero_grad = (weights == 0) & counted, (grads == 0) & counted
    nonzero_weight = (weights != 0) & counted
    row_max = torch.zeros_like(counted).scatter_(-1, weights.argmax(-1, keepdim=True), True)
    heads = (0, 2, 3)
    return GradientStatistics(
        zero_given_zero_weight=((zero_grad & zero_weight).sum(heads) / zero_weight.sum(heads)).double().cpu(),
        zero_given_nonzero_weight=(
            (zero_grad & nonzero_weight & ~row_max).sum(heads) / (nonzero_weight & ~row_max).sum(heads)
        )
        .double()
        .cpu(),
        grad_blind_distance=_blind_distance(_farthest_nonzero((grads != 0) & counted), length).cpu(),
        weight_blind_distance=_blind_distance(_farthest_nonzero(nonzero_weight), length).cpu(),
    )
