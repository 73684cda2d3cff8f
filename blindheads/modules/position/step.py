"""A flat bias near the query and a step down beyond: one knob for how small far weights start."""

from __future__ import annotations

import torch
from torch import Tensor

from blindheads.modules.position.base import PositionComponent, check_finite


class Step(PositionComponent):
    """Bias 0 for keys up to ``near`` tokens back, ``-height`` beyond (every head alike).

    Near keys are told apart by content alone, as under NoPE; a key beyond ``near`` starts ``height`` nats behind
    an equal near one, so its weight starts about ``exp(-height)`` times smaller: the dose of the conjecture's
    decoder arm (``blindheads conjecture``).
    """

    name = "step"

    def __init__(self, near: int, height: float) -> None:
        super().__init__()
        check_finite("step", near=near)  # a height of inf is a mask: the conjecture's masked condition
        if near < 0:
            raise ValueError(f"step near must be >= 0 tokens, got {near}")
        if not height >= 0:
            raise ValueError(f"step height must be >= 0 nats, got {height}")
        self.near, self.height = int(near), float(height)

    def bias(self, d: Tensor, h: Tensor) -> Tensor:
        return torch.where(d > self.near, -self.height, 0.0).to(torch.float32)

    def extra_repr(self) -> str:
        return f"near={self.near}, height={self.height}"
