"""A hard attention window."""

from __future__ import annotations

from torch import Tensor

from blindheads.modules.position.base import PositionComponent, check_finite


class SlidingWindow(PositionComponent):
    """Each query sees only the ``size`` most recent keys (itself included).

    Keys outside the window are masked; the FlexAttention backend skips their blocks instead of computing them.
    """

    name = "sliding_window"

    def __init__(self, size: int) -> None:
        super().__init__()
        check_finite("sliding_window", size=size)
        if size < 1:
            raise ValueError(f"sliding_window size must be >= 1, got {size}")
        self.size = int(size)

    def allowed(self, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx - kv_idx < self.size

    def window(self) -> float:
        return float(self.size)

    def extra_repr(self) -> str:
        return f"size={self.size}"
