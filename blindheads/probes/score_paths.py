"""How each published ALiBi architecture builds its attention logits in transformers' eager code.

The prediction for a head needs its effective slope (the bias per token of distance, after every scaling) and
the dtype whose rounding decides which weights become zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from blindheads.modules.position.slopes import mpt_slopes, press_slopes

if TYPE_CHECKING:  # for annotations only
    from transformers import PreTrainedModel

    from blindheads.export.hf import BlindheadsForCausalLM


@dataclass
class ScorePath:
    architecture: str
    slopes: torch.Tensor | None  # effective slope per head; None: no known additive bias
    softmax: str  # how transformers computes the weights
    notes: list[str] = field(default_factory=list)


def score_path(model: PreTrainedModel) -> ScorePath:
    """The effective ALiBi slopes and softmax of ``model`` (a transformers causal LM) as its eager code runs."""
    config: Any = model.config  # its fields depend on the architecture
    kind = config.model_type
    if kind == "bloom":
        return ScorePath(
            "bloom",
            press_slopes(config.n_head),
            "logits = alibi (model dtype) + q.k / sqrt(d); softmax in float32, cast to the model dtype",
        )
    if kind == "falcon" and getattr(config, "alibi", False):
        head_dim = config.hidden_size // config.num_attention_heads
        return ScorePath(
            "falcon-alibi",
            press_slopes(config.num_attention_heads) / math.sqrt(head_dim),
            "logits = q.k / sqrt(d) + alibi / sqrt(d), both in the model dtype; softmax in float32, cast to the model dtype",
            ["ALiBi slopes are scaled by 1/sqrt(head_dim)", "ALiBi (slope x distance) is computed in bfloat16"],
        )
    if kind == "mpt":
        configured = config.attn_config.alibi_bias_max
        notes = (
            []
            if configured == 8
            else [f"transformers' MPT ignores attn_config.alibi_bias_max={configured} and builds ALiBi with 8"]
        )
        return ScorePath(
            "mpt",
            mpt_slopes(config.n_heads, 8.0),
            "logits = q.k * softmax_scale + alibi; softmax in float32, cast to the model dtype",
            notes,
        )
    if kind == "blindheads":
        components = list(cast("BlindheadsForCausalLM", model).decoder.position)
        slopes = components[0].head_parameters().get("slope") if len(components) == 1 else None
        plain = slopes is not None
        return ScorePath(
            "blindheads",
            slopes.detach().cpu() if slopes is not None else None,
            "logits = q.k / sqrt(d) + bias; softmax in softmax_dtype (eager backend)",
            [] if plain else ["a stack other than plain ALiBi: measured only (blindheads blindness predicts it)"],
        )
    return ScorePath(kind, None, "unknown: measured only")
