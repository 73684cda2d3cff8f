"""FIRE: a learned function of the distance, normalised by the query's position."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from blindheads.modules.position.base import PositionComponent, check_finite


class FIRE(PositionComponent):
    """``bias = f(psi(d) / psi(max(L, i)))`` with ``psi(x) = ln(c * x + 1)`` for a key ``d`` back from the query
    at position ``i`` (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
    Transformers", eq. 3 and their appendix code): ``f`` is an MLP from 1 input through ``width`` ReLU units to one
    output per head, ``c`` and the threshold ``L = |l_multiplier| * min_length`` are learned.

    Defaults are the paper's: width 32, ``c = 0.1``, ``L = 512``, ``eps = 1e-6`` added to the normaliser, the
    MLP initialised as ``torch.nn.Linear`` initialises itself. The bias depends on the query's position
    (``bias_at``) and need not fall with distance (``monotone = False``): the calculator scans the context's last
    query. Its argument lies in ``[0, 1]``, so at the initial weights ``|bias| < 12`` and no head is blind in
    float32 or bfloat16 at any length.
    """

    name = "fire"
    initial_min_length: Tensor  # a buffer
    monotone = False

    def __init__(
        self, width: int = 32, c: float = 0.1, min_length: float = 512.0, eps: float = 1e-6, *, num_heads: int
    ) -> None:
        super().__init__()
        check_finite("fire", width=width, c=c, min_length=min_length, eps=eps)
        if width < 1 or not c > 0 or not min_length > 0 or not eps > 0:
            raise ValueError(
                f"fire needs width >= 1 and positive c, min_length and eps, got width={width}, c={c}, "
                f"min_length={min_length}, eps={eps}"
            )
        self.c = nn.Parameter(torch.tensor(float(c), device="cpu"))
        self.register_buffer("initial_min_length", torch.tensor(float(min_length), device="cpu"))
        self.l_multiplier = nn.Parameter(torch.tensor(1.0, device="cpu"))
        self.eps = float(eps)
        # nn.Linear(1, width) and nn.Linear(width, num_heads) at nn.Linear's default initialisation, kept as plain
        # parameters so the decoder's own initialisation of linear layers leaves them alone
        first, last = nn.Linear(1, width, device="cpu"), nn.Linear(width, num_heads, device="cpu")
        self.hidden_weight = nn.Parameter(first.weight[:, 0].detach())
        self.hidden_bias = nn.Parameter(first.bias.detach())
        self.out_weight, self.out_bias = nn.Parameter(last.weight.detach()), nn.Parameter(last.bias.detach())

    def bias_at(self, d: Tensor, q_idx: Tensor | None, h: Tensor) -> Tensor:
        assert q_idx is not None  # given for a query_dependent stack
        min_length = (self.l_multiplier * self.initial_min_length).abs()
        normaliser = torch.log((self.c * torch.maximum(q_idx.to(d.dtype), min_length)).abs() + 1) + self.eps
        x = torch.log((self.c * d).abs() + 1) / normaliser
        bias = self.out_bias[h]
        for j in range(len(self.hidden_bias)):  # unit by unit: a FlexAttention score_mod takes pointwise ops only
            bias = bias + torch.relu(x * self.hidden_weight[j] + self.hidden_bias[j]) * self.out_weight[h, j]
        return bias

    def head_parameters(self) -> dict[str, Tensor]:
        return {"out_weight": self.out_weight, "out_bias": self.out_bias}

    def extra_repr(self) -> str:
        return f"width={self.hidden_bias.numel()}, eps={self.eps}"
