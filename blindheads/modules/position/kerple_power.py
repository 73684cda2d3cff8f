"""KERPLE's power kernel: a bias that falls with a power of the distance."""

from __future__ import annotations

from torch import Tensor

from blindheads.modules.position.kerple import Kerple


class KerplePower(Kerple):
    """``bias = -r1 * d^r2``, ``r1 > 0`` and ``0 < r2 <= 2`` learned per head (Chi et al. 2022, the power
    variant; ``r2 = 1`` is ALiBi with slope ``r1``). A head goes blind at ``(tau / r1)^(1 / r2)``."""

    name = "kerple_power"
    r1_init, r2_init, r2_max = 1.0, 2.0, 2.0

    def bias(self, d: Tensor, h: Tensor) -> Tensor:
        p = self.head_parameters()
        return -p["r1"][h] * d.pow(p["r2"][h])

    def inverse_bias(self, bias: Tensor, h: Tensor) -> Tensor:
        p = self.head_parameters()
        return (-bias / p["r1"][h].to(bias.dtype)).pow(1 / p["r2"][h].to(bias.dtype))
