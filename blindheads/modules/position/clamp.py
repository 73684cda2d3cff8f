"""A floor on the position bias, so the bias alone can never drive a weight to zero."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from blindheads.modules.position.base import PositionComponent, check_finite
from blindheads.numerics import round_toward_zero, tau

DEFAULT_MARGIN = 8.0


def keeping_floor(dtype: str, threshold: str, context_length: int, margin: float = DEFAULT_MARGIN) -> float:
    """The lowest bias floor at which every bias-only weight stays non-zero, with ``margin`` to spare for q.k.

    A key at the floor gets ``exp(floor - max - ln Z)`` after normalisation, where the row maximum of the bias is 0
    and ``Z``, a sum of at most ``L`` terms no larger than 1, is at most ``L``. It stays at or above the smallest
    kept number ``exp(-tau)`` when ``floor >= -(tau - ln L)``; a fused kernel, which never divides by ``Z`` before
    it tests for zero, needs less. ``margin`` more leaves room for q.k to sit that far below the row's maximum, and
    the floor is rounded toward zero in the training dtype, so the bias cast to it is never lower.
    """
    room = tau(dtype, threshold) - math.log(context_length) - margin
    if not room > 0:
        raise ValueError(
            f"no clamp floor keeps every weight in {dtype} ({threshold} threshold, tau {tau(dtype, threshold):.2f}) "
            f"at context {context_length} with margin {margin}: tau - ln(L) - margin = {room:.2f} <= 0; lower the "
            "margin, shorten the context or train in a wider dtype"
        )
    return round_toward_zero(-room, dtype)


class Clamp(PositionComponent):
    """``bias <- max(bias, floor)``.

    By default the floor is ``keeping_floor``: the highest bias-only logit gap that still leaves every weight of a
    ``context_length``-token row non-zero after normalisation in the training dtype and threshold mode, less
    ``margin`` (8 nats unless set) for q.k. So only content at least ``margin`` below the row's maximum can make a
    head blind. An explicit ``floor`` replaces the derivation (``margin`` then does not apply).
    """

    name = "clamp"

    def __init__(
        self,
        floor: float | None = None,
        margin: float | None = None,
        *,
        dtype: str = "bfloat16",
        threshold: str = "normal",
        context_length: int = 2048,
    ) -> None:
        super().__init__()
        check_finite("clamp", dtype=dtype, floor=floor, margin=margin)  # a floor of -inf (-1e400) clamps nothing
        if floor is not None and margin is not None:
            raise ValueError(f"clamp takes a floor ({floor}) or a margin ({margin}), not both")
        if margin is not None and not margin >= 0:
            raise ValueError(f"clamp margin must be >= 0, got {margin}")
        if floor is None:
            self.margin: float | None = DEFAULT_MARGIN if margin is None else float(margin)
            floor = keeping_floor(dtype, threshold, context_length, self.margin)
        else:
            self.margin = None
        if not floor < 0:
            raise ValueError(f"clamp floor must be negative, got {floor}")
        self.floor = float(floor)

    def limit_bias(self, bias: Tensor) -> Tensor:
        return bias.clamp_min(self.floor)

    def inverse_limit_bias(self, bias: Tensor) -> Tensor:
        return torch.where(bias <= self.floor, torch.full_like(bias, -math.inf), bias)

    def extra_repr(self) -> str:
        return f"floor={self.floor:.6g}" + ("" if self.margin is None else f", margin={self.margin:g}")
