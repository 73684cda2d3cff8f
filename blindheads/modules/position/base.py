"""The contract every position component follows, and the stack that composes them.

A component changes one or more stages of how an attention logit is built; every stage it leaves alone is the
identity. With ``d = q_idx - kv_idx`` (the distance back to the key) the stack computes, for each head ``h``::

    q, k   <- rotate(q, k)                          # RoPE
    d      <- distance(d)                           # log-scaled distances
    bias   <- sum of bias_at(d, q_idx, h)           # ALiBi, KERPLE, T5 buckets: bias(d, h); FIRE: also q_idx
    bias   <- limit_bias(bias)                      # clamping
    logit  <- logits(scores(q.k / sqrt(D)) + bias)  # soft capping, before or after the bias
    masked <- not allowed(q_idx, kv_idx)            # causality, sliding windows

The stage functions take broadcastable tensors, so one definition serves FlexAttention's ``score_mod`` (0-d index
tensors) and the materialised bias of the SDPA and eager backends (index grids). For the blindness calculator each
stage that changes the bias may have an inverse, so a head's blindness distance has a closed form
(``blindheads.blindness`` composes them). Without one the calculator bisects a bias that never rises with distance
(``monotone``, the default) and scans every distance of the context for one that may (a learned table, an MLP).

A component registers under its ``name`` when its class is defined, so a new bias is one file (imported by the
package's ``__init__``): a subclass with a ``name``, its ``bias`` (or ``bias_at``), ``monotone`` if it may rise, and
``head_parameters`` if it has any.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from blindheads.numerics import resolve_dtype

COMPONENTS: dict[str, type[PositionComponent]] = {}  # name in a spec -> class, filled as subclasses are defined


class PositionComponent(nn.Module):
    """One piece of position handling. Subclasses override the stages they change and their inverses.

    ``monotone``: whether the bias-only logit never rises with distance when this component is in the stack
    (every stage of the builtin components keeps that but a learned bias table or MLP). ``name``: the name a spec
    uses; a subclass that sets one is registered by it.
    """

    name: ClassVar[str] = ""
    monotone: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if not name:
            return
        taken = COMPONENTS.get(name)
        if taken is not None and _path(taken) != _path(cls):  # the same class defined again (a reload) replaces
            raise ValueError(f"position component name {name!r} is taken by {_path(taken)}; choose another")
        COMPONENTS[name] = cls

    def prepare(self, length: int, head_size: int, device: torch.device) -> None:
        """Cache what depends only on the sequence length (called once per forward, outside compiled blocks)."""

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def unchanged(self, x: Tensor) -> Tensor:
        """A stage this component leaves alone (each stage is named in the module docstring)."""
        return x

    distance = inverse_distance = limit_bias = inverse_limit_bias = scores = logits = inverse_logits = unchanged

    def bias(self, d: Tensor, h: Tensor) -> Tensor | None:
        """The additive bias of head ``h`` for keys ``d`` back; ``None``: this component adds none."""
        return None

    def bias_at(self, d: Tensor, q_idx: Tensor | None, h: Tensor) -> Tensor | None:
        """The bias of head ``h`` for keys ``d`` back from queries at position ``q_idx``. Only a bias that depends
        on where the query is (FIRE) overrides it; the others define ``bias``."""
        return self.bias(d, h)

    def inverse_bias(self, bias: Tensor, h: Tensor) -> Tensor:
        """The transformed distance at which this head's bias equals ``bias`` (optional: see the module docstring)."""
        raise NotImplementedError

    def head_parameters(self) -> dict[str, Tensor]:
        """Each head's parameters in the units of the bias formula, name -> tensor with the head first (reports
        and monitors read them); learned ones are functions of the trained parameters. None for most stages."""
        return {}

    def allowed(self, q_idx: Tensor, kv_idx: Tensor) -> Tensor | None:
        return None

    def window(self) -> float:
        """Keys this far back or further are masked out; ``inf`` for no window."""
        return math.inf


BIAS_DTYPE = torch.float32  # the position bias is computed in it, and the components keep their numbers in it


def used_in(dtype: str | torch.dtype | None = None) -> tuple[torch.dtype, ...]:
    """The dtypes a component's numbers are used in: float32 (``BIAS_DTYPE``), then ``dtype``, the one attention
    trains in (the bias is cast to it, and a true-precision trainer casts every parameter and buffer to it)."""
    return tuple(dict.fromkeys((BIAS_DTYPE, BIAS_DTYPE if dtype is None else resolve_dtype(dtype))))


def not_finite_in(values: Tensor | list[float], dtype: str | torch.dtype | None = None) -> torch.dtype | None:
    """The first dtype of ``used_in(dtype)`` in which some of ``values`` is not finite, or ``None``: ``1e39`` is a
    finite Python float but ``inf`` in float32, ``1e5`` ``inf`` in float16."""
    values = torch.as_tensor(values, device="cpu").detach().to(torch.float64)
    return next((where for where in used_in(dtype) if not torch.isfinite(values.to(where)).all()), None)


def finite_range(dtype: torch.dtype, positive: bool = False) -> str:
    """``"float32 (magnitude up to 3.403e+38)"``, or with ``positive`` from its smallest positive (subnormal) number
    up: what a refusal says a number must fit in."""
    info = torch.finfo(dtype)
    low = f"from {info.tiny * info.eps:.4g}" if positive else "magnitude"
    return f"{str(dtype).removeprefix('torch.')} ({low} up to {info.max:.4g})"


def check_finite(component: str, *, dtype: str | None = None, **values) -> None:
    """Refuse a number that is not finite (``nan``, ``inf``; ``1e400`` reads as ``inf``), or not finite in float32 or
    the training ``dtype`` where it is used (``not_finite_in``), naming the option: no component takes one (a step's
    ``height`` of ``inf``, a mask, is the one exception, and does not call this)."""
    for name, value in values.items():
        check_number(component, name, value, dtype)


def check_number(component: str, name: str, value: Any, dtype: str | None = None) -> None:
    """``check_finite`` for one option ``name`` (a number or a list of them)."""
    given = value if isinstance(value, (list, tuple)) else [value]
    numbers = [_as_float(v) for v in given if isinstance(v, (int, float))]
    if not all(math.isfinite(v) for v in numbers):
        raise ValueError(f"{component} {name} must be finite, got {value}")
    where = not_finite_in(numbers, dtype) if numbers else None
    if where is not None:
        raise ValueError(f"{component} {name} must be finite in {finite_range(where)}, got {value}")


def _as_float(number: int | float) -> float:
    try:
        return float(number)
    except OverflowError:  # an integer beyond any float
        return math.inf


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


INVERSES = {
    "distance": "inverse_distance",
    "bias": "inverse_bias",
    "limit_bias": "inverse_limit_bias",
    "logits": "inverse_logits",
}


def overrides(component: PositionComponent, method: str) -> bool:
    """Whether ``component`` changes the stage (or has the inverse) ``method``."""
    return getattr(type(component), method) is not getattr(PositionComponent, method)


class PositionStack(nn.Module):
    """An ordered list of position components, applied stage by stage (see the module docstring)."""

    def __init__(self, components: list[PositionComponent], num_heads: int) -> None:
        super().__init__()
        self.components = nn.ModuleList(components)
        self.num_heads = num_heads

    def __iter__(self) -> Iterator[PositionComponent]:
        return iter(cast(list[PositionComponent], self.components))  # ModuleList is not generic: these are its items

    @property
    def has_bias(self) -> bool:
        return any(overrides(c, "bias") or overrides(c, "bias_at") for c in self)

    @property
    def monotone(self) -> bool:
        """Whether the bias-only logit never rises with distance, so its first zero is where every later key's is."""
        return all(c.monotone for c in self)

    @property
    def query_dependent(self) -> bool:
        """Whether the bias depends on the query's position as well as on the distance (FIRE)."""
        return any(overrides(c, "bias_at") for c in self)

    @property
    def is_additive(self) -> bool:
        """Whether the logit is q.k plus a score-independent bias, so SDPA can take it as an additive mask."""
        return not any(overrides(c, "scores") or overrides(c, "logits") for c in self)

    @property
    def is_causal_only(self) -> bool:
        """Whether attention needs nothing but a causal mask (NoPE, RoPE): the fastest kernels apply."""
        return not self.has_bias and self.is_additive and not any(overrides(c, "allowed") for c in self)

    def window(self) -> float:
        return min((c.window() for c in self), default=math.inf)

    def learned_head_parameters(self) -> dict[str, Tensor]:
        """The ``head_parameters`` of every component that trains any parameter (what monitors follow)."""
        learned = [c for c in self if any(p.requires_grad for p in c.parameters())]
        return {name: value for c in learned for name, value in c.head_parameters().items()}

    def prepare(self, length: int, head_size: int, device: torch.device) -> None:
        for c in self:
            c.prepare(length, head_size, device)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        for c in self:
            q, k = c.rotate(q, k)
        return q, k

    def bias_of_distance(self, d: Tensor, h: Tensor, q_idx: Tensor | None = None) -> Tensor:
        """The limited bias at (already causal, non-negative) distance ``d`` for head ``h`` and queries at
        ``q_idx`` (needed only by a ``query_dependent`` stack)."""
        for c in self:
            d = c.distance(d)
        bias = torch.zeros_like(d)
        for c in self:
            b = c.bias_at(d, q_idx, h)
            if b is not None:
                bias = bias + b
        for c in self:
            bias = c.limit_bias(bias)
        return bias

    def logit(self, score: Tensor, bias: Tensor) -> Tensor:
        for c in self:
            score = c.scores(score)
        logit = score + bias
        for c in self:
            logit = c.logits(logit)
        return logit

    def score_mod(self, score: Tensor, b: Tensor | None, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        """FlexAttention's ``score_mod``; also applied to whole index grids by the other backends."""
        d = (q_idx - kv_idx).clamp_min(0).to(torch.float32)
        return self.logit(score, self.bias_of_distance(d, h, q_idx))

    def mask_mod(self, b: Tensor | None, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        allowed = q_idx >= kv_idx
        for c in self:
            extra = c.allowed(q_idx, kv_idx)
            if extra is not None:
                allowed = allowed & extra
        return allowed

    def index_grid(self, q_len: int, q_end: int, device: torch.device, kv_len: int | None = None):
        """Head, query and key indices shaped to broadcast to (heads, q_len, kv_len), for the queries at positions
        ``q_end - q_len .. q_end - 1`` against keys ``0 .. kv_len - 1`` (``kv_len`` defaults to ``q_end``)."""
        h = torch.arange(self.num_heads, device=device)[:, None, None]
        q_idx = torch.arange(q_end - q_len, q_end, device=device)[None, :, None]
        kv_idx = torch.arange(q_end if kv_len is None else kv_len, device=device)[None, None, :]
        return h, q_idx, kv_idx

    def dense_bias(self, q_len: int, q_end: int, device: torch.device, kv_len: int | None = None) -> Tensor:
        """The additive bias with ``-inf`` at masked keys, shaped (heads, q_len, kv_len), in float32, for queries
        ending at position ``q_end`` (see ``index_grid``)."""
        h, q_idx, kv_idx = self.index_grid(q_len, q_end, device, kv_len)
        zero = torch.zeros((), device=device)
        bias = self.score_mod(zero, zero, h, q_idx, kv_idx)
        bias = bias.expand(self.num_heads, q_len, kv_idx.shape[-1])
        return bias.masked_fill(~self.mask_mod(zero, h, q_idx, kv_idx), -math.inf)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
