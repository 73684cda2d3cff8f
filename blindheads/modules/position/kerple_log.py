"""KERPLE's logarithmic kernel: a bias that falls with the log of the distance."""

from __future__ import annotations

from torch import Tensor

from blindheads.modules.position.kerple import Kerple


class KerpleLog(Kerple):
    """``bias = -r1 * ln(1 + r2 * d)``, ``r1, r2 > 0`` learned per head (Chi et al. 2022, eq. for the
    logarithmic variant). A head goes blind at ``(exp(tau / r1) - 1) / r2``: at the initial ``r1 < 2`` no head
    is blind in float32 or bfloat16 before ``e^43`` tokens."""

    name = "kerple_log"
    r1_init, r2_init = 2.0, 1.0

    def bias(self, d: Tensor, h: Tensor) -> Tensor:
        p = self.head_parameters()
        return -p["r1"][h] * (p["r2"][h] * d).log1p()

    def inverse_bias(self, bias: Tensor, h: Tensor) -> Tensor:
        p = self.head_parameters()
        return (-bias / p["r1"][h].to(bias.dtype)).expm1() / p["r2"][h].to(bias.dtype)
