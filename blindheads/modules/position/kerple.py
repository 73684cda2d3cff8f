"""The two parameters per head of KERPLE's kernels (Chi et al. 2022, "KERPLE: Kernelized Relative Positional
Embedding for Length Extrapolation"), shared by ``kerple_log`` and ``kerple_power``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from blindheads.modules.position.base import PositionComponent, check_number

EPS = 1e-2  # the authors' code clamps both parameters to at least this after every step


class Kerple(PositionComponent):
    """Per head, ``r1`` (the kernel's scale) and ``r2`` (its shape), kept in ``[EPS, r2_max]``.

    Unset, they start as KERPLE's code starts them: uniform in ``(0, r1_init)`` and ``(0, r2_init)`` per head
    (the model's seed decides). The authors clamp the parameters in place after each step; here the clamp is part
    of the bias, so the trained value outside the range gets no gradient until it returns.
    """

    r1_init: float
    r2_init: float
    r2_max: float = float("inf")

    def __init__(
        self, r1: list[float] | None = None, r2: list[float] | None = None, *, num_heads: int, learnable: bool = True
    ) -> None:
        super().__init__()
        self.learnable = learnable
        r1_values = self._initial("r1", r1, self.r1_init, num_heads)
        r2_values = self._initial("r2", r2, self.r2_init, num_heads)
        if (r2_values > self.r2_max).any():
            raise ValueError(f"{self.name} r2 must be at most {self.r2_max}, got {r2_values.tolist()}")
        self.raw_r1 = nn.Parameter(r1_values, requires_grad=learnable)
        self.raw_r2 = nn.Parameter(r2_values, requires_grad=learnable)

    def _initial(self, label: str, given: list[float] | None, scale: float, num_heads: int) -> Tensor:
        if given is None:
            return torch.rand(num_heads, device="cpu") * scale
        check_number(self.name, label, list(given))
        values = torch.tensor([float(v) for v in given], device="cpu")
        if values.numel() != num_heads or not (values > 0).all():
            raise ValueError(f"{self.name} {label} takes {num_heads} positive values (one per head), got {given}")
        return values

    def head_parameters(self) -> dict[str, Tensor]:
        return {"r1": self.raw_r1.clamp(EPS), "r2": self.raw_r2.clamp(EPS, self.r2_max)}

    def extra_repr(self) -> str:
        return f"learnable={self.learnable}"
