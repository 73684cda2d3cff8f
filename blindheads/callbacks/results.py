"""The results file of ``blindheads test``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import lightning as L

from blindheads.callbacks.periodic import evaluated_step

HEADLINE = re.compile(
    r"^test/(loss|ppl|(passkey|needle)/(auc|samples)_\w+|extrapolation/\d+x/loss|underflow/mean_\w+)$"
)


class ResultsFile(L.Callback):
    """After ``test``, writes every logged metric (losses, evaluation summaries) to ``results.json`` in the log
    directory, with the checkpoint it came from."""

    def __init__(self, filename: str = "results.json") -> None:
        self.filename = filename
        self.path: Path | None = None

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank reads it, rank 0 writes
        if not trainer.is_global_zero:
            return
        metrics = {}
        for key, value in sorted(trainer.callback_metrics.items()):
            number = float(value)
            metrics[key] = number if math.isfinite(number) else str(number)
        self.path = Path(log_dir or trainer.default_root_dir) / self.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        results = {
            "ckpt_path": trainer.ckpt_path,
            "global_step": evaluated_step(trainer, pl_module),
            "metrics": metrics,
        }
        self.path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results: {self.path}")
        for key, value in metrics.items():
            if HEADLINE.match(key):
                print(f"  {key:<40} {value:.4g}" if isinstance(value, float) else f"  {key:<40} {value}")
