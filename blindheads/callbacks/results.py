"""The results file of ``blindheads test``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import lightning as L

from blindheads import atomic
from blindheads.callbacks.periodic import evaluated_step

HEADLINE = re.compile(
    r"^test/(loss|ppl|(passkey|needle)/(auc|samples)_\w+|extrapolation/\d+x/loss|underflow/mean_\w+"
    r"|blind_distance/layer\d+/head\d+|blind_distance_predicted/materialized/head\d+)$"
)
LAPTOP_RESULTS = "results/laptop/summary.md"
DENSE_RECALL_RESULTS = "results/dense_recall/summary.md"


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
        results = {
            "ckpt_path": trainer.ckpt_path,
            "global_step": evaluated_step(trainer, pl_module),
            "metrics": metrics,
        }
        atomic.write_text(self.path, json.dumps(results, indent=2) + "\n")
        print(f"results: {self.path}")
        for key, value in metrics.items():
            if HEADLINE.match(key):
                print(f"  {key:<48} {value:.4g}" if isinstance(value, float) else f"  {key:<48} {value}")
        retrieval = [v for k, v in metrics.items() if re.match(r"^test/(passkey|needle)/acc_in_domain$", k)]
        if retrieval and not any(isinstance(v, float) and v > 0 for v in retrieval):
            print(
                f"  retrieval: no passkey or needle prompt answered inside the training length; this model is too "
                f"small or too briefly trained to retrieve. {LAPTOP_RESULTS} shows what the suite measures at "
                f"laptop scale; {DENSE_RECALL_RESULTS} a 2-layer model learning held-out recall in minutes on a "
                "dense retrieval mix"
            )
