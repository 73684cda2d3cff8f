"""Which heads are going blind, measured in the model being trained."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F

from blindheads.blindness import blind_distances, tau
from blindheads.callbacks.periodic import PeriodicEvaluation, log_scalars, tensorboard, training_length
from blindheads.evaluation.figures import zero_share_by_distance, zero_share_heatmap
from blindheads.evaluation.underflow import ZeroStatistics, causal_zero_share, zero_statistics

PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}


def autocast_dtype(trainer: L.Trainer) -> torch.dtype:
    """The dtype attention computes in under the trainer's precision (``bf16-mixed`` -> bfloat16, ...)."""
    return PRECISION_DTYPES.get(str(trainer.precision).split("-")[0], torch.float32)


class UnderflowMonitor(PeriodicEvaluation):
    """On a fixed held-out probe batch at ``length_factors`` x the training length, runs every layer with the eager
    backend and its softmax in the training precision, and logs per layer x head:

    - ``underflow/layer{l}/head{h}``: share of causal weights exactly zero (at the training length; the mean of
      every probe length is ``underflow/mean_{f}x``);
    - ``blind_distance/layer{l}/head{h}``: the measured blindness distance (longest probe; a head the probe never
      saw blind logs nothing), beside ``blind_distance_predicted/head{h}`` from the calculator;
    - ``grad_zero/layer{l}/head{h}``: share of causal logits whose gradient is exactly zero (training length);
    - images: the layer x head zero-share heatmap and underflow share against distance per head.

    Rank 0 probes and writes while the other ranks wait at their next collective, so all stay in step.
    """

    def __init__(self, every_n_steps: int | None = 500, length_factors: list[float] = (1.0, 2.0),
                 batch_size: int = 1, gradients: bool = True) -> None:
        super().__init__(every_n_steps)
        self.length_factors, self.batch_size, self.gradients = list(length_factors), batch_size, gradients
        self.statistics: dict[int, list[ZeroStatistics]] = {}
        self.grad_zero: list[torch.Tensor] = []

    def _probe_tokens(self, trainer, length: int) -> torch.Tensor:
        return trainer.datamodule.heldout_windows(self.batch_size, length)

    def _attention_modules(self, pl_module):
        return [block.attn.weights for block in pl_module.decoder.blocks]

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        decoder, dtype = pl_module.decoder, autocast_dtype(trainer)
        modules = self._attention_modules(pl_module)
        saved_dtypes = [m.dtype for m in modules]
        was_training = pl_module.training
        pl_module.eval()
        try:
            for m in modules:
                m.dtype = dtype
            base = training_length(trainer, pl_module)
            lengths = sorted({int(round(f * base)) for f in self.length_factors})
            self.statistics = {n: self._forward_statistics(trainer, decoder, modules, n, pl_module.device)
                               for n in lengths}
            if self.gradients:
                self.grad_zero = self._gradient_zero_share(trainer, decoder, modules, base, pl_module.device)
        finally:
            for m, saved in zip(modules, saved_dtypes):
                m.dtype = saved
            pl_module.train(was_training)
        return self._log(trainer, pl_module, base, dtype, prefix)

    @torch.no_grad()
    def _forward_statistics(self, trainer, decoder, modules, length, device) -> list[ZeroStatistics]:
        per_layer: list[ZeroStatistics | None] = [None] * len(modules)

        def reduce(layer):
            def hook(module, inputs, weights):
                per_layer[layer] = zero_statistics(weights)  # one layer's weights at a time
            return hook

        handles = [m.register_forward_hook(reduce(i)) for i, m in enumerate(modules)]
        try:
            with trainer.precision_plugin.forward_context():
                decoder.hidden_states(self._probe_tokens(trainer, length)[:, :-1].to(device), attention="eager")
        finally:
            for handle in handles:
                handle.remove()
        return per_layer

    def _gradient_zero_share(self, trainer, decoder, modules, length, device) -> list[torch.Tensor]:
        logits = []
        handles = [m.register_forward_hook(lambda module, inputs, output: logits.append(inputs[0])) for m in modules]
        try:  # validate and test run under inference mode, which enable_grad alone does not leave
            with torch.inference_mode(False), torch.enable_grad(), trainer.precision_plugin.forward_context():
                tokens = self._probe_tokens(trainer, length).to(device).clone()  # a tensor autograd may save
                hidden = decoder.hidden_states(tokens[:, :-1], attention="eager")
                loss = F.cross_entropy(decoder.lm_head(hidden).flatten(0, 1).float(), tokens[:, 1:].flatten())
                grads = torch.autograd.grad(loss, logits)
        finally:
            for handle in handles:
                handle.remove()
        return [causal_zero_share(g) for g in grads]

    def _log(self, trainer, pl_module, base: int, dtype: torch.dtype, prefix: str) -> dict:
        scalars = {}
        for length, layers in self.statistics.items():
            scalars[f"{prefix}underflow/mean_{length / base:g}x"] = float(torch.stack([s.zero_share for s in layers]).mean())
        at_base = self.statistics.get(base) or next(iter(self.statistics.values()))
        longest = self.statistics[max(self.statistics)]
        for layer, (stats, far) in enumerate(zip(at_base, longest)):
            for head, share in enumerate(stats.zero_share.tolist()):
                scalars[f"{prefix}underflow/layer{layer}/head{head}"] = share
            for head, distance in enumerate(far.blind_distance.tolist()):
                if math.isfinite(distance):
                    scalars[f"{prefix}blind_distance/layer{layer}/head{head}"] = distance
        for layer, shares in enumerate(self.grad_zero):
            for head, share in enumerate(shares.tolist()):
                scalars[f"{prefix}grad_zero/layer{layer}/head{head}"] = share
        threshold = pl_module.config.threshold
        predicted = blind_distances(pl_module.decoder.position, tau(dtype, threshold))
        for head, distance in enumerate(predicted.tolist()):
            if math.isfinite(distance):
                scalars[f"{prefix}blind_distance_predicted/head{head}"] = distance
        log_scalars(trainer, pl_module, scalars, prefix)
        writer = tensorboard(trainer)
        if writer is not None:
            writer.add_figure(f"{prefix}underflow/heatmap", zero_share_heatmap(at_base), trainer.global_step)
            writer.add_figure(f"{prefix}underflow/by_distance", zero_share_by_distance(longest, predicted), trainer.global_step)
        return scalars
