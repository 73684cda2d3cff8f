"""Log-scaled distances: the bias grows with ln(1 + d) instead of d."""

from __future__ import annotations

from torch import Tensor

from blindheads.modules.position.base import PositionComponent


class LogDistance(PositionComponent):
    """``d <- ln(1 + d)``: a head with slope m goes blind at ``exp(tau / m) - 1`` instead of ``tau / m``."""

    name = "log_distance"

    def distance(self, d: Tensor) -> Tensor:
        return d.log1p()

    def inverse_distance(self, d: Tensor) -> Tensor:
        return d.expm1()
