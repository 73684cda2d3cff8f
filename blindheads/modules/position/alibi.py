"""Attention with Linear Biases."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from blindheads.modules.position.base import PositionComponent, check_finite
from blindheads.modules.position.slopes import resolve_slopes


class ALiBi(PositionComponent):
    """ALiBi (Press et al.): ``bias = -m_h * d`` for a key ``d`` tokens back.

    ``slopes`` is a scheme name (``press``, the default, ``mpt``, ``steep``, ``safe``, ``wide``, ``robust``) or one
    slope per head; ``blind_distances`` instead picks slopes so head h goes blind ``D_h`` tokens back in ``dtype``
    under ``threshold`` (so it is refused beside ``slopes``). ``alibi_bias_max`` is MPT's exponent range, used by
    ``slopes=mpt`` alone: given with any other slopes it would change nothing, and is refused. ``scale``
    multiplies the slopes (``alibi(scale=16)``: Press's x 16, the bias 256 tokens back that the default has 4,096
    back); it is refused beside ``blind_distances``, which choose the slopes themselves. With ``learnable=True`` the
    log-slopes are trained (slopes stay positive).
    """

    name = "alibi"
    fixed_slopes: Tensor  # a buffer, registered when the slopes are not learnable

    def __init__(
        self,
        slopes: str | list[float] | None = None,
        *,
        num_heads: int,
        context_length: int = 2048,
        blind_distances: list[float] | None = None,
        alibi_bias_max: float | None = None,
        dtype: str = "bfloat16",
        threshold: str = "normal",
        learnable: bool = False,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        check_finite("alibi", alibi_bias_max=alibi_bias_max, scale=scale)
        if not scale > 0:
            raise ValueError(f"alibi scale must be > 0, got {scale}")
        if scale != 1.0 and blind_distances is not None:
            raise ValueError(f"alibi scale={scale} would move the blind distances ({blind_distances}) that choose the "
                             "slopes: give one or the other")  # fmt: skip
        if blind_distances is not None and slopes is not None:
            raise ValueError(f"alibi takes slopes ({slopes}) or blind_distances ({blind_distances}), not both: the "
                             "distances choose the slopes")  # fmt: skip
        if alibi_bias_max is not None and (slopes != "mpt" or blind_distances is not None):
            raise ValueError(
                f"alibi alibi_bias_max={alibi_bias_max} is used only by slopes=mpt (MPT's exponent range), not by "
                f"slopes={'blind_distances' if blind_distances is not None else slopes or 'press'}: give slopes=mpt "
                "or drop it"
            )
        if alibi_bias_max is not None and not alibi_bias_max > 0:
            raise ValueError(f"alibi alibi_bias_max must be > 0, got {alibi_bias_max}")
        slopes = "press" if slopes is None else slopes
        self.scheme = slopes if isinstance(slopes, str) and blind_distances is None else "explicit"
        initial = resolve_slopes(
            slopes,
            num_heads,
            context_length,
            alibi_bias_max=8.0 if alibi_bias_max is None else alibi_bias_max,
            blind_distances=blind_distances,
            dtype=dtype,
            threshold=threshold,
        )
        initial, self.scale = (initial * scale).to(torch.float32), scale
        self.learnable = learnable
        if learnable:
            self.log_slopes = nn.Parameter(initial.log())
        else:
            self.register_buffer("fixed_slopes", initial)

    @property
    def slopes(self) -> Tensor:
        return self.log_slopes.exp() if self.learnable else self.fixed_slopes

    def bias(self, d: Tensor, h: Tensor) -> Tensor:
        return -self.slopes[h] * d

    def head_parameters(self) -> dict[str, Tensor]:
        return {"slope": self.slopes}

    def inverse_bias(self, bias: Tensor, h: Tensor) -> Tensor:
        return -bias / self.slopes[h].to(bias.dtype)

    def extra_repr(self) -> str:
        return f"scheme={self.scheme}, learnable={self.learnable}" + (
            "" if self.scale == 1.0 else f", scale={self.scale:g}"
        )
