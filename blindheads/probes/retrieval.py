"""Passkey and needle retrieval of a published model, with its own tokenizer, scored as the callbacks score ours."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from blindheads.evaluation.prompts import needle_samples, passkey_samples
from blindheads.evaluation.scoring import score_samples
from blindheads.evaluation.sweep import score_sweep

if TYPE_CHECKING:  # for annotations only
    from transformers import PreTrainedModel

DEPTHS = (0.0, 0.5, 1.0)
SAMPLES_PER_CELL = 2


class TransformersDecoder(nn.Module):
    """The ``hidden_states`` / ``lm_head`` view of a transformers causal LM that the retrieval scorer uses."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model, self.lm_head = model, model.get_output_embeddings()

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.base_model(tokens, use_cache=False).last_hidden_state


def retrieval_sweeps(model: PreTrainedModel, tokenizer, stream: torch.Tensor, lengths: list[int]) -> dict[str, dict]:
    """Per task, the sweep's scores (as a dict) over ``lengths`` x ``DEPTHS``; in domain up to the model's context."""
    config = model.config
    context = getattr(config, "max_position_embeddings", 0) or getattr(config, "max_seq_len", max(lengths))
    depths = list(DEPTHS)
    tasks = {
        "passkey": passkey_samples(tokenizer, lengths, depths, SAMPLES_PER_CELL),
        "needle": needle_samples(tokenizer, stream.tolist(), lengths, depths, SAMPLES_PER_CELL),
    }
    decoder = TransformersDecoder(model)
    return {
        task: score_sweep(score_samples(decoder, tokenizer, samples, batch_size=1), lengths, depths, context).to_dict()
        for task, samples in tasks.items()
    }
