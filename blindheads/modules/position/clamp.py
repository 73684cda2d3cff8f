"""A floor on the position bias, so the bias alone can never drive a weight to zero."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from blindheads.blindness import tau
from blindheads.modules.position.base import PositionComponent


class Clamp(PositionComponent):
    """``bias <- max(bias, floor)``.

    The default floor is ``-tau(dtype, threshold)`` of the training dtype: the bias then stops where the softmax
    would start returning exact zeros (a weight of exactly ``exp(-tau)`` is still kept), so only the content of q.k
    can make a head blind.
    """

    def __init__(self, floor: float | None = None, dtype: str = "bfloat16", threshold: str = "normal") -> None:
        super().__init__()
        if floor is None:
            floor = -tau(dtype, threshold)
        if not floor < 0:
            raise ValueError(f"clamp floor must be negative, got {floor}")
        self.floor = float(floor)

    def limit_bias(self, bias: Tensor) -> Tensor:
        return bias.clamp_min(self.floor)

    def inverse_limit_bias(self, bias: Tensor) -> Tensor:
        return torch.where(bias <= self.floor, torch.full_like(bias, -math.inf), bias)

    def extra_repr(self) -> str:
        return f"floor={self.floor:.4g}"
