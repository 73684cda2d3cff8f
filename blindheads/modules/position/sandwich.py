"""Sandwich: the inner product of sinusoidal position embeddings, a bias bounded at every distance."""

from __future__ import annotations

import torch
from torch import Tensor

from blindheads.modules.position.base import PositionComponent, check_finite, check_number

MAX_DIM = 8192  # the bias adds dim / 2 cosines, one pointwise op each (FlexAttention's score_mod takes no reduction)


class Sandwich(PositionComponent):
    """``bias = s_h * (sum_{k=1}^{D/2} cos(d / base^(2k/D)) - D/2)`` for a key ``d`` back (Chi, Fan, Rudnicky and
    Ramadge 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive Field Analysis", arXiv
    2212.10356), as NVIDIA NeMo computes it: ``SandwichRelativePositionEmbedding`` in
    ``nemo/collections/nlp/modules/common/megatron/position_embedding/sandwich_relative_position_embedding.py``.

    The sum is ``p_i . p_j`` for sinusoidal embeddings of dimension ``dim`` (NeMo: the size of one head, 64 here
    by default, as in ``smollm-148m``), with NeMo's frequencies ``base^(-2k/D)`` for ``k = 1 .. D/2``; NeMo
    subtracts its value at ``d = 0``, ``D/2``, so ``bias(0) = 0`` and ``bias <= 0``, and divides head ``h``
    (``0 .. H-1``) by ``8 (h + 1) / H``: ``scales`` defaults to ``s_h = H / (8 (h + 1))`` and takes one positive
    scale per head instead.

    Each cosine lies in ``[-1, 1]``, so ``-dim * s_h <= bias <= 0`` at every distance: a head whose bound
    ``dim * s_h`` is below ``tau`` is never blind, however long the context (at the defaults head 0's bound is
    ``dim * H / 8``, 64 with 8 heads, below float32's and bfloat16's tau of 87.3). The cosines oscillate, so the bias
    rises again between its dips (``monotone = False``): the calculator scans it.
    """

    name = "sandwich"
    monotone = False
    scales: Tensor  # a buffer: the per-head scale s_h

    def __init__(
        self,
        dim: int = 64,
        base: float = 10000.0,
        scales: list[float] | None = None,
        *,
        num_heads: int,
        dtype: str = "bfloat16",
    ) -> None:
        super().__init__()
        check_finite("sandwich", dim=dim, base=base)
        if isinstance(dim, bool) or not isinstance(dim, int) or not 2 <= dim <= MAX_DIM or dim % 2:
            raise ValueError(f"sandwich dim must be an even integer from 2 to {MAX_DIM}, got {dim!r}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"sandwich base must be a number > 1, got {base!r}")
        if scales is None:
            values = [num_heads / (8 * (h + 1)) for h in range(num_heads)]  # NeMo: divided by (h + 1) * 8 / H
        else:
            if not isinstance(scales, (list, tuple)):
                raise ValueError(f"sandwich scales takes a list of {num_heads} positive values, got {scales!r}")
            check_number("sandwich", "scales", list(scales), dtype)
            values = [float(s) for s in scales]
            if len(values) != num_heads or not all(s > 0 for s in values):
                raise ValueError(f"sandwich scales takes {num_heads} positive values (one per head), got {scales}")
        check_number("sandwich", "bound dim * scale", [dim * s for s in values], dtype)
        self.dim, self.base = dim, float(base)
        # Python floats: a bias of float64 distances (the calculator) keeps float64 frequencies
        self.frequencies = tuple(1.0 / self.base ** (2 * k / dim) for k in range(1, dim // 2 + 1))
        self.register_buffer("scales", torch.tensor(values, dtype=torch.float32, device="cpu"))

    def bias(self, d: Tensor, h: Tensor) -> Tensor:
        total = torch.zeros_like(d)
        for frequency in self.frequencies:  # pointwise, frequency by frequency (see MAX_DIM)
            total = total + torch.cos(d * frequency)
        return (total - self.dim / 2) * self.scales[h].to(d.dtype)

    def bound(self) -> Tensor:
        """Per head, the most the bias can fall below its value at ``d = 0``: ``dim * s_h``."""
        return self.dim * self.scales

    def head_parameters(self) -> dict[str, Tensor]:
        return {"scale": self.scales}

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}"
