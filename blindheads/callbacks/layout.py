"""A TensorBoard custom-scalars layout written with the run, so its charts group what belongs together: underflow
per layer where heads go blind (the longest length measured), each head's measured and predicted blind distance,
recall by distance, passkey and needle by length, loss. It is built from the configured evaluations, so every chart
draws tags they write (TensorBoard shows an empty "Matches (0)" chart for a pattern nothing writes)."""

from __future__ import annotations

import re
from typing import cast

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from blindheads.blindness import predicted_blind_distances
from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.callbacks.extrapolation import LengthExtrapolation
from blindheads.callbacks.periodic import autocast_dtype, scaled_lengths, training_length
from blindheads.callbacks.retrieval import RetrievalEval
from blindheads.callbacks.underflow import UnderflowMonitor, length_label
from blindheads.datamodules.fineweb import datamodule_of
from blindheads.evaluation.tags import (
    STAGES,
    blind_distance_tag,
    extrapolation_tag,
    loss_tag,
    predicted_tag,
    recall_tag,
    retrieval_exact_tag,
    retrieval_tag,
    underflow_mean_tag,
    underflow_tag,
)
from blindheads.modules.lm import DecoderLM
from blindheads.running import running

PREFIX = f"({'|'.join(STAGES)})?"
SOFTMAXES = "(materialized|fused)"  # both predictions, in one chart


def chart(*patterns: str) -> list:
    """One line chart of every tag matching ``patterns`` (TensorBoard colours its lines by run, not by tag: what
    must be told apart goes in separate charts)."""
    return ["Multiline", [PREFIX + pattern for pattern in patterns]]


def layout(trainer: L.Trainer, pl_module: DecoderLM) -> dict:
    """The CUSTOM SCALARS tab: categories of charts, each a list of tag regexes drawn together, for the evaluations
    in ``trainer.callbacks``."""
    categories = {}
    for callback in running(trainer).callbacks:
        if isinstance(callback, UnderflowMonitor):
            categories.update(underflow_charts(trainer, pl_module, callback))
    points = [
        p
        for c in running(trainer).callbacks
        if isinstance(c, EpisodeRecall)
        for p in c.points(datamodule_of(trainer).seq_len)
    ]
    if points:
        names = "|".join(map(re.escape, points))
        parts = {"exact": "exact", "failed: fact blind": "failed_blind", "failed: fact reachable": "failed_reachable"}
        categories["recall by distance"] = {
            title: chart(recall_tag(f"({names})", part) + "$") for title, part in parts.items()
        }
    tasks = [c.task for c in running(trainer).callbacks if isinstance(c, RetrievalEval)]
    if tasks:
        charts = {
            f"{task}, exact by length and depth": chart(retrieval_exact_tag(task, r"\d+", r"\d+") + "$")
            for task in tasks
        }
        charts["AUC in and beyond the training length"] = chart(
            retrieval_tag(f"({'|'.join(tasks)})", "auc_(in|out_of)_domain") + "$"
        )
        categories["retrieval"] = charts
    categories["loss"] = {"train and validation": chart(loss_tag("train/") + "$", loss_tag() + "$")}
    if any(isinstance(c, LengthExtrapolation) for c in running(trainer).callbacks):
        categories["loss"]["by length"] = chart(extrapolation_tag(r"\d+") + "$")
    return categories


def underflow_charts(trainer: L.Trainer, pl_module: DecoderLM, monitor: UnderflowMonitor) -> dict:
    """Underflow per layer at the monitor's longest length (at the training length little or nothing is blind), and
    per head its measured blind distance beside the predicted ones, in separate charts. A head is measured blind only
    within the longest length: heads predicted blind beyond it share one chart of predictions."""
    base = training_length(trainer, pl_module)
    longest = max(scaled_lengths(base, monitor.length_factors))
    at = length_label(longest, base)
    config = pl_module.decoder.config
    assert config.num_layers is not None  # DecoderConfig fills its shape
    underflow = {
        f"layer {layer}": chart(underflow_tag(layer, r"\d+", at=re.escape(at)) + "$")
        for layer in range(config.num_layers)
    }
    underflow["mean over layers and heads, by length"] = chart(underflow_mean_tag(r"[\d.]+x") + "$")
    predicted = [
        predicted_blind_distances(pl_module.decoder.position, longest, autocast_dtype(trainer), config.threshold, s)
        for s in ("materialized", "fused")
    ]
    distances, beyond = {}, []
    for head, distance in enumerate(torch.maximum(*predicted).tolist()):
        if distance <= longest:
            distances[f"head {head}: measured (each layer)"] = chart(blind_distance_tag(r"\d+", head) + "$")
            distances[f"head {head}: predicted"] = chart(predicted_tag(SOFTMAXES, head) + "$")
        elif distance != float("inf"):
            beyond.append(str(head))
    if beyond:
        distances[f"heads {', '.join(beyond)}: predicted (beyond {longest} tokens)"] = chart(
            predicted_tag(SOFTMAXES, f"({'|'.join(beyond)})") + "$"
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
                logger.experiment.add_custom_scalars(layout(trainer, cast(DecoderLM, pl_module)))  # the CLI's model
