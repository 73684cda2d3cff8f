"""Soft capping of attention logits, before or after the position bias is added."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from blindheads.modules.position.base import PositionComponent, check_finite

WHERE = ("before", "after")


class SoftCap(PositionComponent):
    """``x <- cap * tanh(x / cap)``.

    ``where="before"`` caps q.k alone and then adds the bias (llm-foundry's order: the cap does not bound the bias);
    ``where="after"`` caps q.k + bias, so no logit falls below ``-cap`` and a cap below tau keeps every head sighted.
    """

    name = "soft_cap"

    def __init__(self, cap: float = 30.0, where: str = "after") -> None:
        super().__init__()
        check_finite("soft_cap", cap=cap)
        if not cap > 0:
            raise ValueError(f"soft_cap cap must be positive, got {cap}")
        if where not in WHERE:
            raise ValueError(f"soft_cap where={where!r} is not one of {WHERE}")
        self.cap = float(cap)
        self.where = where

    def _cap(self, x: Tensor) -> Tensor:
        return self.cap * torch.tanh(x / self.cap)

    def scores(self, s: Tensor) -> Tensor:
        return self._cap(s) if self.where == "before" else s

    def logits(self, s: Tensor) -> Tensor:
        return self._cap(s) if self.where == "after" else s

    def inverse_logits(self, s: Tensor) -> Tensor:
        if self.where == "before":
            return s
        inside = s.abs() < self.cap
        safe = torch.where(inside, s, torch.zeros_like(s))
        return torch.where(inside, self.cap * torch.atanh(safe / self.cap), torch.full_like(s, -math.inf))

    def extra_repr(self) -> str:
        return f"cap={self.cap}, where={self.where}"
