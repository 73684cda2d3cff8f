"""Validation loss by position beyond the training length."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch

from blindheads.callbacks.charts import chart
from blindheads.callbacks.periodic import PeriodicEvaluation, log_scalars, training_length
from blindheads.datamodules.text import datamodule_of
from blindheads.evaluation.contexts import evaluating
from blindheads.evaluation.scoring import token_losses
from blindheads.evaluation.tags import extrapolation_tag
from blindheads.modules.lm import DecoderLM


class LengthExtrapolation(PeriodicEvaluation):
    """Held-out loss at multiples of the training length, overall and by position.

    Every ``every_n_steps`` steps and at ``validate``/``test``: held-out loss (natural text, no episodes) at
    ``factors`` x the training length, overall and per bucket of one training length of positions
    (``extrapolation/4x/bucket2`` is the loss on positions 2L..3L-1 of 4L-token sequences); with ``position_bucket``
    (tokens), also per bucket of that many positions at the training length (``extrapolation/1x/at32``: positions
    32..63), the loss by position inside the window. Each rank scores its share of ``sequences`` per factor."""

    def __init__(
        self,
        every_n_steps: int | None = 500,
        factors: Sequence[int] = (1, 2, 4, 8),
        sequences: int = 2,
        position_bucket: int | None = None,
    ) -> None:
        if sequences < 1 or any(f < 1 for f in factors) or (position_bucket is not None and position_bucket < 1):
            raise ValueError(f"factors, sequences and position_bucket must be >= 1, got {list(factors)}, {sequences} "
                             f"and {position_bucket}")  # fmt: skip
        super().__init__(every_n_steps)
        self.factors, self.sequences, self.position_bucket = list(factors), sequences, position_bucket

    @torch.no_grad()
    def charts(self, trainer: L.Trainer, pl_module: DecoderLM, categories: dict[str, dict]) -> None:
        """Held-out loss per length, a chart each (TensorBoard gives every line of a run one colour)."""
        base = training_length(trainer, pl_module)
        loss = categories.setdefault("loss", {})
        for factor in self.factors:
            loss[f"held-out at {factor * base} tokens ({factor}x)"] = chart(extrapolation_tag(factor) + "$")

    def evaluate(self, trainer: L.Trainer, pl_module: DecoderLM, prefix: str = "") -> dict[str, float]:
        base = training_length(trainer, pl_module)
        results = {}
        for factor in self.factors:
            length = factor * base
            tokens = datamodule_of(trainer).heldout_windows(self.sequences, length)
            mine = tokens[trainer.global_rank :: trainer.world_size].to(pl_module.device)
            position_sums = torch.zeros(length, dtype=torch.float64, device=pl_module.device)
            if len(mine):
                with evaluating(pl_module), trainer.precision_plugin.forward_context():
                    position_sums += token_losses(pl_module.decoder, mine).double().sum(dim=0)
            means = trainer.strategy.reduce(position_sums, reduce_op="sum") / self.sequences  # each position's loss
            buckets = means.view(factor, base).mean(dim=1)
            results[extrapolation_tag(factor, "loss", prefix)] = float(buckets.mean())
            results.update({extrapolation_tag(factor, f"bucket{k}", prefix): float(v) for k, v in enumerate(buckets)})
            if self.position_bucket is not None and factor == 1:
                size = self.position_bucket
                for start in range(0, length, size):
                    value = float(means[start : start + size].mean())
                    results[extrapolation_tag(factor, f"at{start}", prefix)] = value
        log_scalars(trainer, pl_module, results, prefix)
        return results
