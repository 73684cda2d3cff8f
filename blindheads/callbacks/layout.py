"""A TensorBoard custom-scalars layout written with the run, so its charts group what belongs together: underflow
per layer where heads go blind (the longest length measured), each head's measured and predicted blind distance,
recall by distance, passkey and needle by length, loss. It is built from the configured evaluations, so every chart
draws tags they write (TensorBoard shows an empty "Matches (0)" chart for a pattern nothing writes)."""

from __future__ import annotations

import re

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from blindheads.blindness import predicted_blind_distances
from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.callbacks.extrapolation import LengthExtrapolation
from blindheads.callbacks.periodic import autocast_dtype, scaled_lengths, training_length
from blindheads.callbacks.retrieval import RetrievalEval
from blindheads.callbacks.underflow import UnderflowMonitor, length_label

PREFIX = r"(val/|test/)?"


def chart(*patterns: str) -> list:
    """One line chart of every tag matching ``patterns`` (TensorBoard colours its lines by run, not by tag: what
    must be told apart goes in separate charts)."""
    return ["Multiline", [PREFIX + pattern for pattern in patterns]]


def layout(trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
    """The CUSTOM SCALARS tab: categories of charts, each a list of tag regexes drawn together, for the evaluations
    in ``trainer.callbacks``."""
    categories = {}
    for callback in trainer.callbacks:
        if isinstance(callback, UnderflowMonitor):
            categories.update(underflow_charts(trainer, pl_module, callback))
    points = [
        p for c in trainer.callbacks if isinstance(c, EpisodeRecall) for p in c.points(trainer.datamodule.seq_len)
    ]
    if points:
        names = "|".join(map(re.escape, points))
        parts = {"exact": "exact", "failed: fact blind": "failed_blind", "failed: fact reachable": "failed_reachable"}
        categories["recall by distance"] = {title: chart(rf"recall/({names})/{tag}$") for title, tag in parts.items()}
    tasks = [c.task for c in trainer.callbacks if isinstance(c, RetrievalEval)]
    if tasks:
        charts = {f"{task}, exact by length and depth": chart(rf"{task}/exact/len\d+/depth\d+$") for task in tasks}
        charts["AUC in and beyond the training length"] = chart(rf"({'|'.join(tasks)})/auc_(in|out_of)_domain$")
        categories["retrieval"] = charts
    categories["loss"] = {"train and validation": chart(r"train/loss$", r"loss$")}
    if any(isinstance(c, LengthExtrapolation) for c in trainer.callbacks):
        categories["loss"]["by length"] = chart(r"extrapolation/\d+x/loss$")
    return categories


def underflow_charts(trainer: L.Trainer, pl_module: L.LightningModule, monitor: UnderflowMonitor) -> dict:
    """Underflow per layer at the monitor's longest length (at the training length little or nothing is blind), and
    per head its measured blind distance beside the predicted ones, in separate charts. A head is measured blind only
    within the longest length: heads predicted blind beyond it share one chart of predictions."""
    base = training_length(trainer, pl_module)
    longest = max(scaled_lengths(trainer, pl_module, monitor.length_factors))
    at = length_label(longest, base)
    config = pl_module.decoder.config
    underflow = {
        f"layer {layer}": chart(rf"underflow/{re.escape(at)}/layer{layer}/head\d+$")
        for layer in range(config.num_layers)
    }
    underflow["mean over layers and heads, by length"] = chart(r"underflow/mean_[\d.]+x$")
    predicted = [
        predicted_blind_distances(pl_module.decoder.position, longest, autocast_dtype(trainer), config.threshold, s)
        for s in ("materialized", "fused")
    ]
    distances, beyond = {}, []
    for head, distance in enumerate(torch.maximum(*predicted).tolist()):
        if distance <= longest:
            distances[f"head {head}: measured (each layer)"] = chart(rf"blind_distance/layer\d+/head{head}$")
            distances[f"head {head}: predicted"] = chart(rf"blind_distance_predicted/(materialized|fused)/head{head}$")
        elif distance != float("inf"):
            beyond.append(str(head))
    if beyond:
        distances[f"heads {', '.join(beyond)}: predicted (beyond {longest} tokens)"] = chart(
            rf"blind_distance_predicted/(materialized|fused)/head({'|'.join(beyond)})$"
        )
    categories = {f"underflow at {longest} tokens ({at}): share of weights exactly zero, per layer": underflow}
    if distances:
        title = f"blind distance at {longest} tokens: measured in eager weights (q.k included), predicted (bias alone)"
        categories[title] = distances
    return categories


class TensorBoardLayout(L.Callback):
    """Writes the layout once per command, on rank 0, to every TensorBoard logger: when the run starts, after a
    checkpoint's weights are loaded (learnable slopes decide which heads go blind)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "validate":  # not each validation of a fit
            self._write(trainer, pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module)

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars(layout(trainer, pl_module))
