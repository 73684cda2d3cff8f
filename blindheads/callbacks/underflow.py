"""Which heads are going blind, measured in the model being trained."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F

from blindheads.blindness import first_blind_token, predicted_blind_distances
from blindheads.callbacks.periodic import PeriodicEvaluation, log_figures, log_scalars, scaled_lengths, training_length
from blindheads.evaluation.contexts import evaluating, forward_hooks
from blindheads.evaluation.figures import zero_share_by_distance, zero_share_heatmap
from blindheads.evaluation.underflow import GradientStatistics, ZeroStatistics, gradient_statistics, zero_statistics

PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}


def autocast_dtype(trainer: L.Trainer) -> torch.dtype:
    """The dtype attention computes in under the trainer's precision (``bf16-mixed`` -> bfloat16, ...)."""
    return PRECISION_DTYPES.get(str(trainer.precision).split("-")[0], torch.float32)


class UnderflowMonitor(PeriodicEvaluation):
    """On a fixed held-out batch at ``length_factors`` x the training length, runs every layer with the eager
    backend and its softmax in the training precision, and logs per layer x head:

    - ``underflow/layer{l}/head{h}``: share of causal weights exactly zero (at the training length; the mean of
      every measured length is ``underflow/mean_{f}x``);
    - ``blind_distance/layer{l}/head{h}``: the measured blindness distance (longest length; a head the batch never
      saw blind logs nothing), beside the calculator's ``blind_distance_predicted/materialized/head{h}`` (the
      definition of the eager softmax measured here, at the longest length) and
      ``blind_distance_predicted/fused/head{h}`` (what FlexAttention training kernels follow);
    - at the training length, from one backward pass (``gradients=True``): ``grad_zero_given_zero_weight/...``
      (must be 1), ``grad_zero_given_nonzero_weight/...`` (gradient blindness beyond weight blindness),
      ``grad_blind_distance/...`` beside ``weight_blind_distance_1x/...``, per layer x head (see
      ``GradientStatistics``); with learnable slopes, ``slope_grad/head{h}`` (the loss gradient of each log-slope)
      and ``slope_grad_beyond_blind/head{h}``, the part of it that comes from keys at or beyond the head's predicted
      blindness distance (materialized, training length), and ``slope_grad_beyond_blind_share/head{h}``,
      ``|beyond| / (|beyond| + |within|)``;
    - images: the layer x head zero-share heatmap and underflow share against distance per head.

    Rank 0 measures and writes while the other ranks wait at their next collective, so all stay in step.
    """

    def __init__(
        self,
        every_n_steps: int | None = 500,
        length_factors: list[float] = (1.0, 2.0),
        batch_size: int = 1,
        gradients: bool = True,
    ) -> None:
        super().__init__(every_n_steps)
        self.length_factors, self.batch_size, self.gradients = list(length_factors), batch_size, gradients
        self.statistics: dict[int, list[ZeroStatistics]] = {}
        self.gradient: list[GradientStatistics] = []
        self.slope_grad: dict[str, torch.Tensor] = {}

    def _measured_tokens(self, trainer, length: int) -> torch.Tensor:
        return trainer.datamodule.heldout_windows(self.batch_size, length)

    def _attention_modules(self, pl_module):
        return [block.attn.weights for block in pl_module.decoder.blocks]

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        decoder, dtype = pl_module.decoder, autocast_dtype(trainer)
        modules = self._attention_modules(pl_module)
        saved_dtypes = [m.dtype for m in modules]
        try:
            for m in modules:
                m.dtype = dtype
            base = training_length(trainer, pl_module)
            lengths = scaled_lengths(trainer, pl_module, self.length_factors)
            with evaluating(pl_module):
                self.statistics = {
                    n: self._forward_statistics(trainer, decoder, modules, n, pl_module.device) for n in lengths
                }
                if self.gradients:
                    self.gradient, self.slope_grad = self._gradient_statistics(trainer, pl_module, modules, base, dtype)
        finally:
            for m, saved in zip(modules, saved_dtypes):
                m.dtype = saved
        return self._log(trainer, pl_module, base, dtype, prefix)

    @torch.no_grad()
    def _forward_statistics(self, trainer, decoder, modules, length, device) -> list[ZeroStatistics]:
        per_layer: list[ZeroStatistics | None] = [None] * len(modules)

        def reduce(layer):
            def hook(module, inputs, weights):
                per_layer[layer] = zero_statistics(weights)  # one layer's weights at a time

            return hook

        with forward_hooks(modules, reduce), trainer.precision_plugin.forward_context():
            decoder.hidden_states(self._measured_tokens(trainer, length)[:, :-1].to(device), attention="eager")
        return per_layer

    def _gradient_statistics(self, trainer, pl_module, modules, length, dtype):
        decoder = pl_module.decoder
        logits, weights = [], []

        def keep(module, inputs, output):
            logits.append(inputs[0])
            weights.append(output)

        # validate and test run under inference mode, which enable_grad alone does not leave
        with forward_hooks(modules, lambda _: keep), torch.inference_mode(False), torch.enable_grad():
            with trainer.precision_plugin.forward_context():
                tokens = (
                    self._measured_tokens(trainer, length).to(pl_module.device).clone()
                )  # a tensor autograd may save
                hidden = decoder.hidden_states(tokens[:, :-1], attention="eager")
                loss = F.cross_entropy(decoder.lm_head(hidden).flatten(0, 1).float(), tokens[:, 1:].flatten())
            grads = torch.autograd.grad(loss, logits, retain_graph=True)
            statistics = [gradient_statistics(x, w, g) for x, w, g in zip(logits, weights, grads)]
            slope_grad = self._slope_gradient(decoder.position, logits, grads, length, dtype, pl_module)
        return statistics, slope_grad

    @staticmethod
    def _slope_gradient(position, logits, grads, length, dtype, pl_module) -> dict[str, torch.Tensor]:
        """Each learnable log-slope's gradient, in total and from keys at or beyond its predicted blindness distance
        (logits are the only path from the slopes to the loss, so back-propagating masked logit gradients splits
        it exactly)."""
        learnable = [c for c in position if getattr(c, "learnable", False)]
        if not learnable:
            return {}
        log_slopes = learnable[0].log_slopes
        predicted = first_blind_token(
            predicted_blind_distances(position, length, dtype, pl_module.config.threshold, "materialized")
        )
        i = torch.arange(length, device=log_slopes.device)
        beyond = ((i[:, None] - i[None, :]) >= predicted.to(log_slopes.device)[:, None, None]).to(grads[0].dtype)
        total = torch.autograd.grad(logits, log_slopes, grads, retain_graph=True)[0]
        far = torch.autograd.grad(logits, log_slopes, [g * beyond for g in grads])[0]
        near = total - far
        return {
            "slope_grad": total.detach().double().cpu(),
            "slope_grad_beyond_blind": far.detach().double().cpu(),
            "slope_grad_beyond_blind_share": (far.abs() / (far.abs() + near.abs())).detach().double().cpu(),
        }

    def _log(self, trainer, pl_module, base: int, dtype: torch.dtype, prefix: str) -> dict:
        scalars = {}
        for length, layers in self.statistics.items():
            share = torch.stack([s.zero_share for s in layers]).mean()
            scalars[f"{prefix}underflow/mean_{length / base:g}x"] = float(share)
        at_base = self.statistics.get(base) or next(iter(self.statistics.values()))
        longest_length = max(self.statistics)
        longest = self.statistics[longest_length]
        for layer, (stats, far) in enumerate(zip(at_base, longest)):
            _per_head(scalars, f"{prefix}underflow/layer{layer}", stats.zero_share)
            _per_head(scalars, f"{prefix}blind_distance/layer{layer}", far.blind_distance)
        for layer, stats in enumerate(self.gradient):
            _per_head(scalars, f"{prefix}grad_zero_given_zero_weight/layer{layer}", stats.zero_given_zero_weight)
            _per_head(scalars, f"{prefix}grad_zero_given_nonzero_weight/layer{layer}", stats.zero_given_nonzero_weight)
            _per_head(scalars, f"{prefix}grad_blind_distance/layer{layer}", stats.grad_blind_distance)
            _per_head(scalars, f"{prefix}weight_blind_distance_1x/layer{layer}", stats.weight_blind_distance)
        for name, values in self.slope_grad.items():
            _per_head(scalars, f"{prefix}{name}", values)
        position, threshold = pl_module.decoder.position, pl_module.config.threshold
        predicted = {
            softmax: predicted_blind_distances(position, longest_length, dtype, threshold, softmax)
            for softmax in ("materialized", "fused")
        }
        for softmax, distances in predicted.items():
            _per_head(scalars, f"{prefix}blind_distance_predicted/{softmax}", distances)
        log_scalars(trainer, pl_module, scalars, prefix)
        figures = {
            f"{prefix}underflow/heatmap": lambda _: zero_share_heatmap(at_base),
            f"{prefix}underflow/by_distance": lambda _: zero_share_by_distance(longest, predicted["materialized"]),
        }
        log_figures(trainer, pl_module, figures)
        return scalars


def _per_head(scalars: dict[str, float], tag: str, values: torch.Tensor) -> None:
    """``tag/head{h}`` for each head's finite value (TensorBoard and JSON take no infinities)."""
    for head, value in enumerate(values.tolist()):
        if math.isfinite(value):
            scalars[f"{tag}/head{head}"] = value
