"""Decoder shapes: one dataclass, with named presets any field of which can be overridden from YAML."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import get_args

import yaml

from blindheads.modules.backends import Backend
from blindheads.modules.position.registry import PositionSpec
from blindheads.numerics import Dtype, Threshold

log = logging.getLogger(__name__)
SHAPE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "mlp_size", "context_length", "init_std")


@dataclass(frozen=True)
class DecoderConfig:
    """A Llama-style decoder: pre-norm blocks of RMSNorm, attention with optional grouped KV heads, SwiGLU."""

    vocab_size: int = 49152
    hidden_size: int = 576
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 9
    mlp_size: int = 1536
    context_length: int = 2048
    init_std: float = 0.0416
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    position: PositionSpec = "alibi"
    attention: Backend = "auto"
    softmax_dtype: Dtype = "float32"
    # The precision attention trains in and how its kernels treat subnormals: the default clamp floor and the
    # slope presets chosen by blindness distance (steep, safe, wide, robust) are computed for these.
    dtype: Dtype = "bfloat16"
    threshold: Threshold = "normal"
    # A preset's shape (``tiny``, ``smollm-148m``): its SHAPE fields replace these fields' values, so a YAML file
    # can name a size instead of restating it (configs/size/tiny.yaml); each value it replaces is logged.
    size: str | None = None

    def __post_init__(self) -> None:
        if self.size is not None:
            self._apply_size()
        for name, choices in (
            ("attention", Backend),
            ("softmax_dtype", Dtype),
            ("dtype", Dtype),
            ("threshold", Threshold),
        ):
            if getattr(self, name) not in get_args(choices):
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(get_args(choices))}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "mlp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.init_std <= 1:
            raise ValueError(
                f"init_std must be in (0, 1], got {self.init_std}: larger weights saturate every norm "
                "and softmax (at 1e6 all logits are equal and every gradient is exactly zero)"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"head size {self.hidden_size // self.num_heads} must be even (RoPE rotates pairs)")

    def _apply_size(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"unknown decoder size {self.size!r}; valid: {', '.join(SIZES)}")
        preset, defaults = SIZES[self.size], DecoderConfig()
        replaced = []
        for name in SHAPE:
            given, value = getattr(self, name), getattr(preset, name)
            if given not in (value, getattr(defaults, name)):
                replaced.append(f"{name} {given} -> {value}")
            object.__setattr__(self, name, value)  # frozen: set once, while constructing
        if replaced:
            log.warning(f"decoder size {self.size!r} replaces {', '.join(replaced)}")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> DecoderConfig:
        if name not in SIZES:
            raise ValueError(f"unknown decoder preset {name!r}; valid: {', '.join(SIZES)}")
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown decoder fields {sorted(unknown)}; valid: {[f.name for f in fields(cls)]}")
        return replace(SIZES[name], **overrides)


SIZES = {
    # SmolLM-135M's shape with full multi-head attention: 147.8M parameters, tied embeddings.
    "smollm-148m": DecoderConfig(),
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


def load_decoder_config(path: str | Path) -> DecoderConfig:
    """A decoder config from YAML: its fields (``size`` names a preset shape, as in the training configs) at the top
    level or under ``model.decoder``."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"model config {path} does not exist") from None
    section = data.get("model", {}).get("decoder", data) if isinstance(data.get("model"), dict) else data
    section = dict(section)
    return DecoderConfig.from_preset("smollm-148m", **section)
