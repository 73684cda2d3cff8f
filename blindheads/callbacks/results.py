"""The results file of ``blindheads test``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning as L

from blindheads import atomic
from blindheads.callbacks.periodic import evaluated_step
from blindheads.evaluation.report import run_report
from blindheads.running import running


class ResultsFile(L.Callback):
    """After ``test``, writes every logged metric (losses, evaluation summaries) to ``results.json`` in the log
    directory, with the checkpoint it came from; ``report`` holds the short summary ``blindheads test`` ends with."""

    def __init__(self, filename: str = "results.json") -> None:
        self.filename = filename
        self.path: Path | None = None
        self.report: list[str] = []

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank reads it, rank 0 writes
        if not trainer.is_global_zero:
            return
        metrics = {}
        for key, value in sorted(trainer.callback_metrics.items()):
            number = float(value)
            metrics[key] = number if math.isfinite(number) else str(number)
        self.path = Path(log_dir or trainer.default_root_dir) / self.filename
        results = {
            "ckpt_path": trainer.ckpt_path,
            "global_step": evaluated_step(trainer, pl_module),
            "metrics": metrics,
        }
        for callback in running(trainer).callbacks:
            results.update(getattr(callback, "results_fields", {}))
        atomic.write_text(self.path, json.dumps(results, indent=2) + "\n")
        numbers = {key: value for key, value in metrics.items() if isinstance(value, float)}
        self.report = [f"results: {self.path}", *run_report(numbers, getattr(trainer.logger, "root_dir", None))]
