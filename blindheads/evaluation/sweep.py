"""The length x depth sweep of passkey and needle prompts: accuracy per (length, depth) cell (a torchmetrics metric,
summed across ranks), AUC over log2 length in and beyond the training length. (The heatmap: ``figures``.)"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torchmetrics import Metric


class CellAccuracy(Metric):
    """Exact-match and per-digit sums per sweep cell; summed across ranks, so sharded samples give the numbers a
    single process would."""

    full_state_update = False
    # states, added in __init__
    exact: torch.Tensor
    digits: torch.Tensor
    count: torch.Tensor

    def __init__(self, num_cells: int) -> None:
        super().__init__()
        self.add_state("exact", torch.zeros(num_cells, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("digits", torch.zeros(num_cells, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(num_cells, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, cell: int, exact: bool, digits: float) -> None:
        self.exact[cell] += float(exact)
        self.digits[cell] += digits
        self.count[cell] += 1

    def compute(self) -> dict[str, torch.Tensor]:
        return {
            "exact": self.exact / self.count.clamp_min(1),
            "digits": self.digits / self.count.clamp_min(1),
            "count": self.count,
        }


def score_sweep(
    scores: list, lengths: list[int], depths: list[float], training_length: int, device: torch.device | str = "cpu"
) -> SweepScores:
    """Scores of retrieval samples (each knows its length and depth) as the sweep's scores; under DDP each rank passes
    its share and the cell sums are reduced across ranks (torchmetrics), so every rank gets the whole sweep."""
    cell_of = {(n, d): i * len(depths) + j for i, n in enumerate(lengths) for j, d in enumerate(depths)}
    metric = CellAccuracy(len(cell_of)).to(device)
    for score in scores:
        metric.update(cell_of[(score.sample.length, score.sample.depth)], score.exact, score.digits)
    totals = {k: v.cpu().numpy().reshape(len(lengths), len(depths)) for k, v in metric.compute().items()}
    return SweepScores(lengths, depths, training_length, totals["exact"], totals["digits"], totals["count"])


def auc_over_log_length(lengths: list[int], accuracy: list[float]) -> float:
    """Trapezoid of accuracy over log2(length), divided by the log2 span: in [0, 1]; one length gives its accuracy."""
    if not lengths:
        return math.nan
    if len(lengths) == 1:
        return float(accuracy[0])
    x = np.log2(np.asarray(lengths, dtype=np.float64))
    y = np.asarray(accuracy, dtype=np.float64)
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


@dataclass
class SweepScores:
    """Accuracy on a length x depth sweep, split at the training length into in-domain and out-of-domain."""

    lengths: list[int]
    depths: list[float]
    training_length: int
    exact: np.ndarray  # (lengths, depths)
    digits: np.ndarray
    count: np.ndarray
    metrics: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        per_length = self.exact.mean(axis=1)
        self.metrics = {}
        for domain, keep in (("in_domain", True), ("out_of_domain", False)):
            chosen = [i for i, n in enumerate(self.lengths) if (n <= self.training_length) == keep]
            self.metrics[f"auc_{domain}"] = auc_over_log_length(
                [self.lengths[i] for i in chosen], [per_length[i] for i in chosen]
            )
            self.metrics[f"acc_{domain}"] = float(self.exact[chosen].mean()) if chosen else math.nan
            self.metrics[f"samples_{domain}"] = float(self.count[chosen].sum())
        self.metrics["digit_acc"] = float(self.digits.mean())

    def cells(self):
        for i, length in enumerate(self.lengths):
            for j, depth in enumerate(self.depths):
                yield length, depth, float(self.exact[i, j]), float(self.digits[i, j]), int(self.count[i, j])

    def to_dict(self) -> dict:
        return {
            "training_length": self.training_length,
            "metrics": self.metrics,
            "cells": [
                {"length": n, "depth": d, "in_domain": n <= self.training_length, "exact": e, "digits": g, "samples": c}
                for n, d, e, g, c in self.cells()
            ],
        }
