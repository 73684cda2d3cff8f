"""Decoder shapes: one dataclass, with named presets any field of which can be overridden from YAML."""

from __future__ import annotations

from dataclasses import dataclass, fields
from numbers import Integral, Real
from pathlib import Path
from typing import Any, get_args

import torch
import yaml

from blindheads.modules.backends import Backend
from blindheads.modules.position.registry import PositionSpec
from blindheads.numerics import Dtype, Threshold, check_horizon

SHAPE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "mlp_size", "context_length", "init_std")
WHOLE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "mlp_size", "context_length")
IN_UNIT = {  # a field that must lie in (low, 1] ([low, 1] when closed): low, closed, why
    "init_std": (0.0, False, "larger weights saturate every norm and softmax (at 1e6 all logits are equal and every "
                             "gradient is exactly zero)"),
    "norm_eps": (torch.finfo(torch.float32).tiny, True, "RMSNorm adds it to a mean square of activations: below "
                 "float32's smallest normal number it is flushed to 0, above 1 it outweighs them"),
}  # fmt: skip


class UnpickledConfigError(ValueError):
    """A ``DecoderConfig`` unpickled from a checkpoint holds a value its checks refuse (``checkpoints.reading`` names
    the file)."""


@dataclass(frozen=True)
class DecoderConfig:
    """The decoder: Llama-style pre-norm blocks (RMSNorm, attention with optional grouped KV heads, SwiGLU).

    Its shape comes from a preset (``size``) except where a value is given: a value given always wins over the
    preset's.

    Args:
        vocab_size: Token ids the embedding holds; the CLI links it from the data module's tokenizer.
        hidden_size: Width of the residual stream (not given: the ``size`` preset's).
        num_layers: Number of decoder blocks (not given: the ``size`` preset's).
        num_heads: Attention heads per block; ``hidden_size / num_heads`` must be even (not given: the preset's).
        num_kv_heads: Key/value heads per block, dividing ``num_heads`` (grouped-query attention); not given:
            ``num_heads`` when that is given, else the preset's.
        mlp_size: Hidden width of each SwiGLU feed-forward layer (not given: the ``size`` preset's).
        context_length: Longest sequence the model is built for; ``data.seq_len`` may not exceed it (not given: the
            preset's).
        init_std: Standard deviation of the initial weights, in (0, 1] (not given: the ``size`` preset's).
        norm_eps: Epsilon of every RMSNorm.
        tie_embeddings: Share the input embedding with the output projection.
        position: The position stack: components joined by ``+``, each ``NAME`` or ``NAME(ARGS)``, e.g.
            ``alibi(wide)+clamp+log_distance``, or a YAML list of such entries. Components: alibi, clamp, fire,
            kerple_log, kerple_power, log_distance, nope, rope, sandwich, sliding_window, soft_cap, step,
            t5_buckets (docs/positions.md). Ready-made stacks: ``--config configs/position/NAME.yaml`` with NAME one of alibi,
            alibi_gradient_floor, alibi_learnable, alibi_zero_free, clamp, clamp_log_distance, fire, kerple_log, kerple_power,
            log_distance, mpt, nope, robust, robust_clamp, rope, safe, sandwich, sliding_window, soft_cap,
            soft_cap_before, steep, t5_buckets, wide, wide_clamp, wide_clamp_log_distance.
        attention: The attention kernel: ``auto`` (``flex`` on CUDA, else ``sdpa``), ``flex`` (FlexAttention; trains
            only on CUDA), ``sdpa`` or ``eager`` (the weights materialised, as the measurements use).
        softmax_dtype: The dtype the eager backend's softmax computes in.
        gradient_floor: A learning horizon ``H`` in nats, or ``None``: the eager softmax's backward pass then sees
            every visible key at least ``e^-H`` of its row's largest weight, while its forward pass stays
            bit-identical (``blindheads.modules.gradient_floor``). Needs ``attention: eager``.
        dtype: The precision attention trains in; the default clamp floor and the slope presets chosen by blindness
            distance (steep, safe, wide, robust) are computed for it. ``--trainer.precision`` must compute in it.
        threshold: How the kernels treat subnormals: ``normal`` (flushed to zero, as fused GPU kernels do: a weight
            below the smallest normal float is 0) or ``subnormal`` (kept: only a weight below half the smallest
            subnormal is 0).
        size: A preset shape (``smollm-148m`` or ``tiny``; not given: ``smollm-148m``) filling the shape fields not
            given, so a YAML file can name a size instead of restating it (configs/size/tiny.yaml).
    """

    vocab_size: int = 49152
    # The shape: ``None`` takes the ``size`` preset's value; a value given wins over the preset's.
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None  # not given: num_heads when that is given (full multi-head attention)
    mlp_size: int | None = None
    context_length: int | None = None
    init_std: float | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    position: PositionSpec = "alibi"
    attention: Backend = "auto"
    softmax_dtype: Dtype = "float32"
    gradient_floor: float | None = None
    # The precision attention trains in and how its kernels treat subnormals: the default clamp floor and the
    # slope presets chosen by blindness distance (steep, safe, wide, robust) are computed for these.
    dtype: Dtype = "bfloat16"
    threshold: Threshold = "normal"
    # A preset's shape (``tiny``; ``None`` is ``smollm-148m``): it fills the SHAPE fields not given, so a YAML file
    # can name a size instead of restating it (configs/size/tiny.yaml). Values given win: a preset never silently
    # replaces what a user wrote.
    size: str | None = None

    def __post_init__(self) -> None:
        source = self._fill_shape()  # field -> where a value not given came from, for the errors below
        # all filled now
        assert self.hidden_size is not None and self.num_heads is not None and self.num_kv_heads is not None
        assert self.init_std is not None
        for name, choices in (
            ("attention", Backend),
            ("softmax_dtype", Dtype),
            ("dtype", Dtype),
            ("threshold", Threshold),
        ):
            if getattr(self, name) not in get_args(choices):
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(get_args(choices))}")
        self._check_numbers(source)
        if self.gradient_floor is not None:
            check_horizon(self.gradient_floor)
            if self.attention != "eager":
                raise ValueError(
                    f"gradient_floor {self.gradient_floor} needs attention eager (the weights it floors are "
                    f"materialised there only), got attention {self.attention}"
                )
        hidden, heads, kv_heads = (f"{name} {getattr(self, name)}{source.get(name, '')}" for name in
                                   ("hidden_size", "num_heads", "num_kv_heads"))  # fmt: skip
        if self.hidden_size % self.num_heads:
            raise ValueError(f"{hidden} is not divisible by {heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{heads} is not a multiple of {kv_heads}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"head size {self.hidden_size // self.num_heads} ({hidden}, {heads}) must be even "
                             "(RoPE rotates pairs)")  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (a checkpoint of a model built in Python holds the config itself) skips ``__init__``: the
        fields read are checked as a constructed config's are, a bad one refused as ``UnpickledConfigError``."""
        for name, value in state.items():
            object.__setattr__(self, name, value)
        try:
            self.__post_init__()
        except (ValueError, TypeError) as error:
            raise UnpickledConfigError(str(error)) from None

    def _check_numbers(self, source: dict[str, str]) -> None:
        """Every numeric field a number in its range (``gradient_floor``: ``check_horizon``), naming the field, the
        value and where it came from; ``nan`` is in no range."""
        for name in WHOLE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}{source.get(name, '')}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}{source.get(name, '')}")
        for name, (low, closed, why) in IN_UNIT.items():
            value = getattr(self, name)
            number = isinstance(value, Real) and not isinstance(value, bool)
            if not (number and (low <= value if closed else low < value) and value <= 1):
                bound = f"[{low:.4g}" if closed else f"({low:.4g}"
                raise ValueError(f"{name} must be in {bound}, 1], got {value!r}{source.get(name, '')}: {why}")

    def _fill_shape(self) -> dict[str, str]:
        """Fill the shape fields not given from the ``size`` preset (``num_kv_heads`` from ``num_heads`` when that is
        given: a preset's grouping may not divide it). Returns, per filled field, the words that name its source,
        for errors about a value the user never wrote."""
        if self.size is not None and self.size not in SIZES:
            raise ValueError(f"unknown decoder size {self.size!r}; valid: {', '.join(SIZES)}")
        filled = {}
        for name in SHAPE:
            if getattr(self, name) is not None:
                continue
            if name == "num_kv_heads" and "num_heads" not in filled:
                value, filled[name] = self.num_heads, " (num_heads's)"
            else:
                preset = self.size or "smollm-148m"
                value, filled[name] = getattr(SIZES[preset], name), f" (the {preset} preset's)"
            object.__setattr__(self, name, value)  # frozen: set once, while constructing
        return filled

    @property
    def head_size(self) -> int:
        assert self.hidden_size is not None and self.num_heads is not None  # filled in __post_init__
        return self.hidden_size // self.num_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> DecoderConfig:
        """The preset's fields, ``overrides`` winning; its shape is filled as ``size`` fills it (so ``num_heads``
        alone brings its own ``num_kv_heads``)."""
        if name not in SIZES:
            raise ValueError(f"unknown decoder preset {name!r}; valid: {', '.join(SIZES)}")
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown decoder fields {sorted(unknown)}; valid: {[f.name for f in fields(cls)]}")
        preset = {f.name: getattr(SIZES[name], f.name) for f in fields(cls) if f.name not in SHAPE}
        return cls(**{**preset, "size": name, **overrides})


SIZES = {
    # SmolLM-135M's shape with full multi-head attention: 147.8M parameters, tied embeddings.
    "smollm-148m": DecoderConfig(
        hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=9, mlp_size=1536, context_length=2048, init_std=0.0416
    ),
    # For tests and CPU smoke runs: grouped KV heads, so that path is always exercised.
    "tiny": DecoderConfig(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        mlp_size=128,
        context_length=128,
        init_std=0.125,
    ),
}


def config_from_fields(fields_: Any, what: str) -> DecoderConfig:
    """A ``DecoderConfig`` from a mapping of its fields (``what`` names where they come from), one line naming an
    unknown key or a bad value, never a ``TypeError`` traceback."""
    known = [f.name for f in fields(DecoderConfig)]
    if not isinstance(fields_, dict):
        raise ValueError(f"{what} is {type(fields_).__name__}, not a mapping of decoder fields")
    unknown = sorted(map(str, set(fields_) - set(known)))
    if unknown:
        raise ValueError(f"{what} has unknown keys {', '.join(unknown)}; valid: {', '.join(known)}")
    try:
        return DecoderConfig(**fields_)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{what}: {error}") from None


def load_decoder_config(*paths: str | Path) -> DecoderConfig:
    """A decoder config from YAML files: their fields (``size`` names a preset shape, as in the training configs) at
    the top level or under ``model.decoder``; a later file's fields win, as with ``blindheads fit --config``."""
    section: dict = {}
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise FileNotFoundError(f"model config {path} does not exist") from None
        model = data.get("model") if isinstance(data, dict) else None
        section |= (model.get("decoder") or {}) if isinstance(model, dict) else data
    return DecoderConfig.from_preset("smollm-148m", **section)
