"""T5's relative position buckets: a learned bias per head and bucket of distances."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from blindheads.modules.position.base import PositionComponent, check_finite


class T5Buckets(PositionComponent):
    """``bias = table[h, bucket(d)]`` (Raffel et al. 2020, section 2.1), unidirectional as in T5's decoder.

    ``bucket`` is transformers' ``T5Attention._relative_position_bucket(-d, bidirectional=False)``: distances
    below ``num_buckets / 2`` get a bucket each, longer ones share log-spaced buckets up to ``max_distance``, and
    every key from ``max_distance`` on shares the last. A learned table can rise and fall with distance
    (``monotone = False``): the calculator scans it. The table starts at 0 (``init_std`` draws it instead), so
    at initialisation no head is blind.
    """

    name = "t5_buckets"
    monotone = False

    def __init__(
        self, num_buckets: int = 32, max_distance: int = 128, init_std: float = 0.0, *, num_heads: int
    ) -> None:
        super().__init__()
        check_finite("t5_buckets", num_buckets=num_buckets, max_distance=max_distance, init_std=init_std)
        if not init_std >= 0:
            raise ValueError(f"t5_buckets init_std must be >= 0, got {init_std}")
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ValueError(
                f"t5_buckets needs num_buckets >= 2 and max_distance > num_buckets / 2, got num_buckets={num_buckets}, "
                f"max_distance={max_distance}"
            )
        self.num_buckets, self.max_distance = int(num_buckets), int(max_distance)
        self.table = nn.Parameter(torch.randn(num_heads, num_buckets, device="cpu") * init_std)

    def bucket(self, d: Tensor) -> Tensor:
        exact = self.num_buckets // 2
        octaves = math.log(self.max_distance / exact)
        large = exact + (torch.log(d.clamp_min(exact) / exact) / octaves * (self.num_buckets - exact)).floor()
        return torch.where(d < exact, d.floor(), large.clamp_max(self.num_buckets - 1)).long()

    def bias(self, d: Tensor, h: Tensor) -> Tensor:
        return self.table[h, self.bucket(d)]

    def head_parameters(self) -> dict[str, Tensor]:
        return {"table": self.table}

    def extra_repr(self) -> str:
        return f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
