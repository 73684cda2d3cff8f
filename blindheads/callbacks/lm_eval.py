"""Standard zero-shot benchmarks from lm-evaluation-harness, on the model being trained or tested."""

from __future__ import annotations

import math

import lightning as L

from blindheads.callbacks.periodic import PeriodicEvaluation, log_scalars
from blindheads.datamodules.text import datamodule_of
from blindheads.evaluation.contexts import evaluating
from blindheads.modules.lm import DecoderLM


class LMEvalHarness(PeriodicEvaluation):
    """Runs lm-evaluation-harness ``tasks`` (by default at ``validate``/``test`` only) on rank 0 and logs every
    metric as ``lm_eval/{task}/{metric}``. ``include_path`` adds task YAMLs, e.g. local data for offline runs;
    ``limit`` caps the documents per task."""

    def __init__(
        self,
        tasks: list[str],
        every_n_steps: int | None = None,
        limit: float | None = None,
        num_fewshot: int | None = None,
        include_path: str | None = None,
        batch_size: int = 8,
    ) -> None:
        super().__init__(every_n_steps)
        from lm_eval.tasks import TaskManager

        self.task_manager = TaskManager(include_path=include_path)
        unknown = [t for t in tasks if not self.task_manager.match_tasks([t])]
        if unknown:
            raise ValueError(
                f"unknown lm-evaluation-harness tasks {unknown}; list them with `lm_eval ls tasks`, or "
                "add task YAMLs with include_path"
            )
        self.tasks, self.limit, self.num_fewshot, self.batch_size = list(tasks), limit, num_fewshot, batch_size
        self.results: dict = {}

    def evaluate(self, trainer: L.Trainer, pl_module: DecoderLM, prefix: str = "") -> dict:
        if not trainer.is_global_zero:
            return {}
        from lm_eval import simple_evaluate

        from blindheads.evaluation.lm_eval_adapter import BlindheadsLM

        with evaluating(pl_module), trainer.precision_plugin.forward_context():
            adapter = BlindheadsLM(
                decoder=pl_module.decoder,
                tokenizer=datamodule_of(trainer).tokenizer,
                batch_size=self.batch_size,
            )
            self.results = simple_evaluate(
                model=adapter,
                tasks=self.tasks,
                limit=self.limit,
                num_fewshot=self.num_fewshot,
                task_manager=self.task_manager,
                log_samples=False,
                bootstrap_iters=0,
            )["results"]
        scalars = {
            f"{prefix}lm_eval/{task}/{name.split(',')[0]}": float(value)
            for task, metrics in self.results.items()
            for name, value in metrics.items()
            if isinstance(value, (int, float)) and "stderr" not in name and math.isfinite(value)
        }
        log_scalars(trainer, pl_module, scalars, prefix)
        return scalars
