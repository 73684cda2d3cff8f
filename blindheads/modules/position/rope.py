"""Rotary position embeddings."""

from __future__ import annotations

import torch
from torch import Tensor

from blindheads.modules.position.base import PositionComponent, check_finite


class RoPE(PositionComponent):
    """RoPE (Su et al.): rotate each pair ``(x_i, x_{i+D/2})`` of q and k by ``pos * theta^(-2i/D)``.

    The logit then depends on ``q_idx - kv_idx`` only through the rotation; no additive bias, so RoPE never makes
    a weight underflow by itself.
    """

    name = "rope"

    def __init__(self, theta: float = 10000.0) -> None:
        super().__init__()
        check_finite("rope", theta=theta)
        if not theta > 1:
            raise ValueError(f"rope theta must be > 1, got {theta}")
        self.theta = theta
        self.cos: Tensor | None = None  # tables of the last prepared length, reused by every layer and step
        self.sin: Tensor | None = None

    def prepare(self, length: int, head_size: int, device: torch.device) -> None:
        self.cos, self.sin = self._cos_sin(length, head_size, device)

    def _cos_sin(self, length: int, dim: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The prepared tables when they fit, else computed (rotate never stores: it may run inside compiled code).
        Tables made under inference mode (validate, test) are not reused outside it, where autograd may need them."""
        cached, cached_sin = self.cos, self.sin
        if (
            cached is not None
            and cached_sin is not None
            and cached.shape == (length, dim)
            and cached.device == torch.device(device)
            and (torch.is_inference_mode_enabled() or not cached.is_inference())
        ):
            return cached, cached_sin
        inv_freq = self.theta ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
        angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self._cos_sin(q.shape[-2], q.shape[-1], q.device)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def extra_repr(self) -> str:
        return f"theta={self.theta}"


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated_half.float() * sin).to(x.dtype)
