"""Reduce causal attention weights to where they are exactly zero, per head, one layer at a time.

Used by the underflow monitor on models being trained and by the probes of published models: each layer's
weights (batch, heads, L, L), queries at positions 0..L-1 over keys 0..i, are reduced as they are produced, so
memory never holds more than one layer's attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ZeroStatistics:
    """Per head: exact zeros and causal pairs by distance, and the farthest distance with a non-zero weight."""

    zeros_by_distance: Tensor  # (heads, L) float64
    pairs_by_distance: Tensor  # (L,) float64
    farthest_nonzero: Tensor  # (heads,) long

    @property
    def zero_share(self) -> Tensor:
        """Share of all causal weights that are exactly zero, per head."""
        return self.zeros_by_distance.sum(-1) / self.pairs_by_distance.sum()

    @property
    def blind_distance(self) -> Tensor:
        """Smallest distance from which every weight is zero; ``inf`` where the probe saw none that far back."""
        distance = (self.farthest_nonzero + 1).double()
        return torch.where(distance < len(self.pairs_by_distance), distance, torch.full_like(distance, math.inf))

    def merge(self, other: ZeroStatistics) -> ZeroStatistics:
        """Statistics of two probe batches of the same length together."""
        return ZeroStatistics(self.zeros_by_distance + other.zeros_by_distance,
                              self.pairs_by_distance + other.pairs_by_distance,
                              torch.maximum(self.farthest_nonzero, other.farthest_nonzero))


def _causal_distances(length: int, device: torch.device) -> tuple[Tensor, Tensor]:
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return j <= i, (i - j).clamp_min(0)


@torch.no_grad()
def zero_statistics(weights: Tensor) -> ZeroStatistics:
    """Reduce causal attention weights (batch, heads, L, L) to ``ZeroStatistics``."""
    batch, heads, length, _ = weights.shape
    causal, distance = _causal_distances(length, weights.device)
    zero = (weights == 0) & causal
    zeros_by_distance = torch.zeros(heads, length, dtype=torch.float64, device=weights.device)
    zeros_by_distance.index_add_(1, distance[causal], zero.sum(0)[:, causal].double())
    # first non-zero key of each query row; rows always hold one (the weights sum to 1)
    first_nonzero = ((weights != 0) & causal).int().argmax(-1)  # (batch, heads, L)
    farthest = (torch.arange(length, device=weights.device) - first_nonzero).amax(dim=(0, 2))
    pairs = batch * (length - torch.arange(length, device=weights.device)).double()
    return ZeroStatistics(zeros_by_distance.cpu(), pairs.cpu(), farthest.cpu())


def causal_zero_share(values: Tensor) -> Tensor:
    """Share of causal entries of (batch, heads, L, L) ``values`` that are exactly zero, per head."""
    causal, _ = _causal_distances(values.shape[-1], values.device)
    return ((values == 0) & causal).sum(dim=(0, 2, 3)).double().cpu() / (values.shape[0] * causal.sum().item())
