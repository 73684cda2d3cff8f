"""Periodic passkey and needle-in-a-haystack evaluation, inside and beyond the training length."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import lightning as L
import numpy as np

from blindheads.callbacks.charts import chart
from blindheads.callbacks.periodic import PeriodicEvaluation, log_figures, log_scalars, scaled_lengths, training_length
from blindheads.datamodules.text import datamodule_of
from blindheads.evaluation.contexts import evaluating
from blindheads.evaluation.figures import sweep_heatmap
from blindheads.evaluation.prompts import RetrievalSample, needle_samples, passkey_samples
from blindheads.evaluation.scoring import score_samples
from blindheads.evaluation.sweep import SweepScores, score_sweep
from blindheads.evaluation.tags import retrieval_exact_tag, retrieval_tag
from blindheads.modules.lm import DecoderLM

BY_CELL, AUC = ", exact by length and depth", "AUC in and beyond the training length"  # the layout's chart titles


class RetrievalEval(PeriodicEvaluation):
    """Evaluates a retrieval task every ``every_n_steps`` training steps and at ``validate``/``test``.

    The sweep is ``length_factors`` x the training length (or explicit ``lengths``) by ``depths``, with ``samples``
    prompts per cell; answers have ``digits`` digits (None: the task's own, 5 for passkey, 7 for needle). Samples are dealt across ranks and their scores summed with torchmetrics, so the numbers equal
    a single process's. Logs flat scalars (``{task}/auc_in_domain``, ``{task}/exact/len{L}/depth{d}``, ...), a
    heatmap image, and at ``test`` writes ``{task}.json`` beside the logs.
    """

    task = "retrieval"

    def __init__(
        self,
        every_n_steps: int | None = 500,
        length_factors: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
        lengths: list[int] | None = None,
        depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
        samples: int = 4,
        batch_size: int = 4,
        seed: int = 0,
        digits: int | None = None,
    ) -> None:
        if samples < 1 or batch_size < 1:
            raise ValueError(f"samples and batch_size must be >= 1, got {samples} and {batch_size}")
        if digits is not None and digits < 1:
            raise ValueError(f"digits must be >= 1 or None, got {digits}")
        if not all(0.0 <= d <= 1.0 for d in depths):
            raise ValueError(f"depths must lie in [0, 1], got {list(depths)}")
        super().__init__(every_n_steps)
        self.length_factors, self.explicit_lengths = list(length_factors), lengths
        self.depths, self.samples, self.batch_size, self.seed = list(depths), samples, batch_size, seed
        self.digits = digits
        self._samples: list[RetrievalSample] | None = None
        self.last: SweepScores | None = None

    def lengths(self, trainer: L.Trainer, pl_module: DecoderLM) -> list[int]:
        return self.lengths_for(training_length(trainer, pl_module))

    def lengths_for(self, training_length: int) -> list[int]:
        """The prompt lengths: ``lengths``, else ``length_factors`` x ``training_length``."""
        if self.explicit_lengths:
            return sorted(self.explicit_lengths)
        return scaled_lengths(training_length, self.length_factors)

    def prompts(self, data, lengths: list[int]) -> list[RetrievalSample]:
        """The task's prompts at ``lengths``, with the data module's tokenizer (and held-out text)."""
        raise NotImplementedError

    def charts(self, trainer: L.Trainer, pl_module: L.LightningModule, categories: dict[str, dict]) -> None:
        """Exact by length and depth per task, then one chart of every task's AUC in and beyond the training length
        (kept last)."""
        retrieval = categories.setdefault("retrieval", {})
        retrieval.pop(AUC, None)
        retrieval[f"{self.task}{BY_CELL}"] = chart(retrieval_exact_tag(self.task, r"\d+", r"\d+") + "$")
        tasks = [title.removesuffix(BY_CELL) for title in retrieval if title.endswith(BY_CELL)]
        retrieval[AUC] = chart(retrieval_tag(f"({'|'.join(tasks)})", "auc_(in|out_of)_domain") + "$")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Build the prompts now: a length they cannot take fails before training, not at the first evaluation."""
        try:
            self.samples_for(trainer, pl_module)
        except ValueError as error:
            lengths = self.lengths(trainer, cast(DecoderLM, pl_module))  # the CLI's model
            raise ValueError(f"{type(self).__name__} at lengths {lengths}: {error}") from None

    def samples_for(self, trainer, pl_module) -> list[RetrievalSample]:
        if self._samples is None:
            self._samples = self.prompts(trainer.datamodule, self.lengths(trainer, pl_module))
        return self._samples

    def evaluate(self, trainer: L.Trainer, pl_module: DecoderLM, prefix: str = "") -> SweepScores:
        lengths = self.lengths(trainer, pl_module)
        samples = self.samples_for(trainer, pl_module)
        mine = samples[trainer.global_rank :: trainer.world_size]
        with evaluating(pl_module), trainer.precision_plugin.forward_context():
            scores = score_samples(pl_module.decoder, datamodule_of(trainer).tokenizer, mine, self.batch_size)
        sweep = score_sweep(scores, lengths, self.depths, training_length(trainer, pl_module), pl_module.device)
        self.last = sweep
        self._log(trainer, pl_module, sweep, prefix)
        return sweep

    def _log(self, trainer, pl_module, sweep: SweepScores, prefix: str) -> None:
        scalars = {
            retrieval_tag(self.task, name, prefix): value for name, value in sweep.metrics.items() if np.isfinite(value)
        }
        for length, depth, exact, _, _ in sweep.cells():
            scalars[retrieval_exact_tag(self.task, length, round(depth * 100), prefix)] = exact
        log_scalars(trainer, pl_module, scalars, prefix)
        heatmap = {
            retrieval_tag(self.task, "heatmap", prefix): lambda step: sweep_heatmap(sweep, f"{self.task}, step {step}")
        }
        log_figures(trainer, pl_module, heatmap)
        log_dir = trainer.log_dir  # a collective under DDP: every rank reads it
        if prefix == "test/" and trainer.is_global_zero and log_dir:
            path = Path(log_dir) / f"{self.task}.json"
            path.write_text(json.dumps(sweep.to_dict(), indent=2) + "\n")


class PasskeyEval(RetrievalEval):
    """The landmark-attention passkey task (filler sentences, a 5-digit key unless ``digits`` says otherwise)."""

    task = "passkey"

    def prompts(self, data, lengths):
        return passkey_samples(data.tokenizer, lengths, self.depths, self.samples, self.seed, self.digits or 5)


class NeedleEval(RetrievalEval):
    """RULER's needle in a haystack of held-out text, optionally with ``distractors`` other needles."""

    task = "needle"

    def __init__(self, *args, distractors: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.distractors = distractors

    def prompts(self, data, lengths):
        haystack = data.heldout_tokens(4 * max(lengths)).tolist()
        return needle_samples(
            data.tokenizer,
            haystack,
            lengths,
            self.depths,
            self.samples,
            self.distractors,
            self.seed,
            self.digits or 7,
        )
