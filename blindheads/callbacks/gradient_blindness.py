"""Where exactly-zero attention weights stop gradients, measured in one backward pass of the model being trained."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from blindheads.blindness import first_blind_token, predicted_blind_distances
from blindheads.callbacks.periodic import PeriodicEvaluation, autocast_dtype, log_scalars, per_head, training_length
from blindheads.evaluation.contexts import evaluating, forward_hooks
from blindheads.evaluation.underflow import GradientStatistics, gradient_statistics


class GradientBlindness(PeriodicEvaluation):
    """On ``batch_size`` held-out windows of the training length, one forward and backward pass with the eager
    backend and its softmax in the training precision; logs per layer x head (see ``GradientStatistics``):

    - ``grad_zero_given_zero_weight/...``: share of zero weights whose logit gradient is zero (must be 1);
    - ``grad_zero_given_nonzero_weight/...``: gradient blindness beyond weight blindness;
    - ``grad_blind_distance/...`` beside ``weight_blind_distance_1x/...``;

    and with learnable slopes, per head, ``slope_grad/head{h}`` (the loss gradient of each log-slope),
    ``slope_grad_beyond_blind/head{h}`` (the part that comes from keys at or beyond the head's predicted blindness
    distance, materialized, training length) and ``slope_grad_beyond_blind_share/head{h}``
    (``|beyond| / (|beyond| + |within|)``). Rank 0 measures; the other ranks wait at their next collective.
    """

    def __init__(self, every_n_steps: int | None = 500, batch_size: int = 1) -> None:
        super().__init__(every_n_steps)
        self.batch_size = batch_size
        self.statistics: list[GradientStatistics] = []
        self.slope_grad: dict[str, torch.Tensor] = {}

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        decoder, dtype, length = pl_module.decoder, autocast_dtype(trainer), training_length(trainer, pl_module)
        logits, weights = [], []

        def keep(module, inputs, output):
            logits.append(inputs[0])
            weights.append(output)

        hooks = forward_hooks([b.attn.weights for b in decoder.blocks], lambda _: keep)
        # validate and test run under inference mode, which enable_grad alone does not leave
        with evaluating(pl_module), hooks, torch.inference_mode(False), torch.enable_grad():
            tokens = trainer.datamodule.heldout_windows(self.batch_size, length).to(pl_module.device).clone()  # savable
            with trainer.precision_plugin.forward_context():
                hidden = decoder.hidden_states(tokens[:, :-1], attention="eager", softmax_dtype=dtype)
                loss = F.cross_entropy(decoder.lm_head(hidden).flatten(0, 1).float(), tokens[:, 1:].flatten())
            grads = torch.autograd.grad(loss, logits, retain_graph=True)
            self.statistics = [gradient_statistics(x, w, g) for x, w, g in zip(logits, weights, grads)]
            self.slope_grad = slope_gradient(pl_module, logits, grads, length, dtype)
        scalars = {}
        for layer, stats in enumerate(self.statistics):
            per_head(scalars, f"{prefix}grad_zero_given_zero_weight/layer{layer}", stats.zero_given_zero_weight)
            per_head(scalars, f"{prefix}grad_zero_given_nonzero_weight/layer{layer}", stats.zero_given_nonzero_weight)
            per_head(scalars, f"{prefix}grad_blind_distance/layer{layer}", stats.grad_blind_distance)
            per_head(scalars, f"{prefix}weight_blind_distance_1x/layer{layer}", stats.weight_blind_distance)
        for name, values in self.slope_grad.items():
            per_head(scalars, f"{prefix}{name}", values)
        log_scalars(trainer, pl_module, scalars, prefix)
        return scalars


def slope_gradient(pl_module, logits, grads, length: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Each learnable log-slope's gradient, in total and from keys at or beyond its predicted blindness distance
    (logits are the only path from the slopes to the loss, so back-propagating masked logit gradients splits it
    exactly)."""
    position = pl_module.decoder.position
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
