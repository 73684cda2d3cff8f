"""Which heads are going blind, measured in the forward pass of the model being trained."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial
from typing import cast

import lightning as L
import torch

from blindheads.blindness import predicted_blind_distances
from blindheads.callbacks.charts import chart
from blindheads.callbacks.periodic import (
    PeriodicEvaluation,
    autocast_dtype,
    log_figures,
    log_scalars,
    per_head,
    scaled_lengths,
    training_length,
)
from blindheads.evaluation.contexts import evaluating, forward_hooks
from blindheads.evaluation.figures import blind_distance_figure, zero_share_by_distance, zero_share_heatmap
from blindheads.evaluation.tags import (
    blind_distance_figure_tag,
    blind_distance_tag,
    deaf_figure_tag,
    deaf_tag,
    predicted_tag,
    underflow_figure_tag,
    underflow_mean_tag,
    underflow_tag,
)
from blindheads.evaluation.underflow import ZeroStatistics, zero_statistics
from blindheads.modules.lm import DecoderLM
from blindheads.numerics import LEARNING_HORIZON, check_horizon


class UnderflowMonitor(PeriodicEvaluation):
    """Per head, the share of causal attention weights that are exactly zero, measured vs predicted.

    On a fixed held-out batch at ``length_factors`` x the training length, runs every layer with the eager
    backend and its softmax in the training precision, and logs per layer x head:

    - ``underflow/layer{l}/head{h}``: share of causal weights exactly zero at the training length, and
      ``underflow/{f}x/layer{l}/head{h}`` at the longest (where heads go blind); the mean of every measured length
      is ``underflow/mean_{f}x``;
    - ``deaf/layer{l}/head{h}`` and ``deaf/{f}x/layer{l}/head{h}``: beside them, the share past the learning
      horizon, below ``e^-horizon`` of the row's largest weight (exact zeros included), where a head stops learning
      to read a key long before it is blind;
    - ``blind_distance/layer{l}/head{h}``: the measured blindness distance (longest length; a head the batch never
      saw blind logs nothing), beside the calculator's ``blind_distance_predicted/materialized/head{h}`` (the
      definition of the eager softmax measured here, at the longest length) and
      ``blind_distance_predicted/fused/head{h}`` (what FlexAttention training kernels follow); during fit the
      predictions are logged only where the position stack trains (fixed slopes predict the same at every step);
    - images: the layer x head heatmaps of the zero share and of the share past the horizon (``deaf/heatmap``),
      underflow share against distance per head, and each head's measured blind distance (each layer) beside its
      predictions (``blind_distance/by_head``), at the longest length.

    What the zeros do to gradients is ``GradientBlindness``'s. Rank 0 measures and writes while the other ranks
    wait at their next collective, so all stay in step.
    """

    def __init__(
        self,
        every_n_steps: int | None = 500,
        length_factors: Sequence[float] = (1.0, 2.0),
        batch_size: int = 1,
        horizon: float = LEARNING_HORIZON,
    ) -> None:
        """``horizon``: the learning horizon in nats (default: ``blindheads.numerics.LEARNING_HORIZON``)."""
        super().__init__(every_n_steps)
        self.length_factors, self.batch_size = list(length_factors), batch_size
        self.horizon = check_horizon(horizon)
        self.statistics: dict[int, list[ZeroStatistics]] = {}

    def evaluate(self, trainer: L.Trainer, pl_module: DecoderLM, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        dtype = autocast_dtype(trainer)
        with evaluating(pl_module):
            self.statistics = {
                length: self._statistics(trainer, pl_module, length, dtype)
                for length in scaled_lengths(training_length(trainer, pl_module), self.length_factors)
            }
        return self._log(trainer, pl_module, training_length(trainer, pl_module), dtype, prefix)

    @torch.no_grad()
    def charts(self, trainer: L.Trainer, pl_module: DecoderLM, categories: dict[str, dict]) -> None:
        categories.update(underflow_charts(trainer, pl_module, self))

    def _statistics(self, trainer, pl_module, length: int, dtype: torch.dtype) -> list[ZeroStatistics]:
        blocks = pl_module.decoder.blocks
        per_layer: list[ZeroStatistics | None] = [None] * len(blocks)

        def reduce(layer):
            def hook(module, inputs, weights):
                per_layer[layer] = zero_statistics(weights, self.horizon)  # one layer's weights at a time

            return hook

        tokens = trainer.datamodule.heldout_windows(self.batch_size, length)[:, :-1].to(pl_module.device)
        with (
            forward_hooks([block.attn.weights for block in blocks], reduce),
            trainer.precision_plugin.forward_context(),
        ):
            pl_module.decoder.hidden_states(tokens, attention="eager", softmax_dtype=dtype)
        return cast(list[ZeroStatistics], per_layer)  # every layer's hook has run

    def _log(self, trainer, pl_module, base: int, dtype: torch.dtype, prefix: str) -> dict:
        scalars = {}
        for length, layers in self.statistics.items():
            share = torch.stack([s.zero_share for s in layers]).mean()
            scalars[underflow_mean_tag(length_label(length, base), prefix)] = float(share)
        at_base = self.statistics.get(base) or next(iter(self.statistics.values()))
        longest_length = max(self.statistics)
        longest = self.statistics[longest_length]
        at = length_label(longest_length, base)
        for layer, (stats, far) in enumerate(zip(at_base, longest)):
            per_head(scalars, partial(underflow_tag, layer, prefix=prefix), stats.zero_share)
            per_head(scalars, partial(underflow_tag, layer, at=at, prefix=prefix), far.zero_share)
            per_head(scalars, partial(deaf_tag, layer, prefix=prefix), stats.deaf_share)
            per_head(scalars, partial(deaf_tag, layer, at=at, prefix=prefix), far.deaf_share)
            per_head(scalars, partial(blind_distance_tag, layer, prefix=prefix), far.blind_distance)
        position, threshold = pl_module.decoder.position, pl_module.config.threshold
        predicted = {
            softmax: predicted_blind_distances(position, longest_length, dtype, threshold, softmax)
            for softmax in ("materialized", "fused")
        }
        if prefix or learned(position):  # during fit, fixed positions would log the same value at every step
            for softmax, distances in predicted.items():
                per_head(scalars, partial(predicted_tag, softmax, prefix=prefix), distances)
        log_scalars(trainer, pl_module, scalars, prefix)
        figures = {
            underflow_figure_tag("heatmap", prefix): lambda _: zero_share_heatmap(
                longest, f"share of causal weights exactly zero at {longest_length} tokens"
            ),
            deaf_figure_tag(prefix): lambda _: zero_share_heatmap(
                longest,
                f"share of causal weights below e^-{self.horizon:g} of their row's largest at {longest_length} tokens",
                deaf=True,
            ),
            underflow_figure_tag("by_distance", prefix): lambda _: zero_share_by_distance(
                longest, predicted["materialized"]
            ),
            blind_distance_figure_tag(prefix): lambda step: blind_distance_figure(
                torch.stack([s.blind_distance for s in longest]),
                predicted,
                longest_length,
                f"blind distance per head at {longest_length} tokens, step {step}",
            ),
        }
        log_figures(trainer, pl_module, figures)
        return scalars


def underflow_charts(trainer: L.Trainer, pl_module: DecoderLM, monitor: UnderflowMonitor) -> dict:
    """Charts of one line each (TensorBoard gives every line of a run one colour): underflow's mean over layers and
    heads per length measured (per head, the heatmap image); for each head predicted blind within the longest length
    its measured blind distance per layer, and where the position stack trains its prediction (materialized, the
    softmax measured). The images ``blind_distance/by_head`` and ``underflow/by_distance`` set them side by side."""
    base = training_length(trainer, pl_module)
    lengths = scaled_lengths(base, monitor.length_factors)
    longest = max(lengths)
    config = pl_module.decoder.config
    assert config.num_layers is not None  # DecoderConfig fills its shape
    underflow = {
        f"mean at {length} tokens ({length_label(length, base)})": chart(
            underflow_mean_tag(re.escape(length_label(length, base))) + "$"
        )
        for length in lengths
    }
    position = pl_module.decoder.position
    trains = learned(position)
    predicted = [
        predicted_blind_distances(position, longest, autocast_dtype(trainer), config.threshold, s)
        for s in ("materialized", "fused")
    ]
    distances = {}
    for head, distance in enumerate(torch.maximum(*predicted).tolist()):
        if distance <= longest:
            for layer in range(config.num_layers):
                distances[f"head {head}, layer {layer}: measured"] = chart(blind_distance_tag(layer, head) + "$")
            if trains:
                distances[f"head {head}: predicted"] = chart(predicted_tag("materialized", head) + "$")
    categories = {"underflow: share of causal weights exactly zero, mean over layers and heads": underflow}
    if distances:
        title = f"blind distance at {longest} tokens: measured in eager weights (q.k included)"
        categories[title + (", predicted (bias alone)" if trains else "")] = distances
    return categories


def learned(position) -> bool:
    """Whether training changes the position stack, and with it the predicted blind distances."""
    return any(p.requires_grad for p in position.parameters())


def length_label(length: int, base: int) -> str:
    """A length as a multiple of the training length, as tags name it: ``8x``, ``1.5x``."""
    return f"{length / base:g}x"
