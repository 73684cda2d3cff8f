"""Where exactly-zero attention weights stop gradients, measured in one backward pass of the model being trained."""

from __future__ import annotations

from functools import partial
from typing import cast

import lightning as L
import torch
import torch.nn.functional as F

from blindheads.blindness import first_blind_token, predicted_blind_distances
from blindheads.callbacks.periodic import PeriodicEvaluation, autocast_dtype, log_scalars, per_head, training_length
from blindheads.datamodules.text import datamodule_of
from blindheads.evaluation.contexts import evaluating, forward_hooks
from blindheads.evaluation.tags import gradient_tag
from blindheads.evaluation.underflow import GradientStatistics, gradient_statistics
from blindheads.modules.decoder import Block
from blindheads.modules.lm import DecoderLM


class GradientBlindness(PeriodicEvaluation):
    """Per head, where the gradient goes blind beside the weights, and the gradient of learned position parameters.

    On ``batch_size`` held-out windows of the training length, one forward and backward pass with the eager
    backend and its softmax in the training precision; logs per layer x head (see ``GradientStatistics``):

    - ``grad_zero_given_zero_weight/...``: share of zero weights whose logit gradient is zero (must be 1);
    - ``grad_zero_given_nonzero_weight/...``: gradient blindness beyond weight blindness;
    - ``grad_blind_distance/...`` beside ``weight_blind_distance_1x/...``;

    and for each learned head parameter ``P`` of the position stack (``slope`` of learnable ALiBi, ``r1`` and ``r2``
    of KERPLE, a T5 ``table``, FIRE's ``out_weight`` and ``out_bias``), per head, ``P_grad/head{h}`` (the loss
    gradient of the trained parameter behind it, e.g. ALiBi's log-slope, summed over the head's entries),
    ``P_grad_beyond_blind/head{h}`` (the part that comes from keys at or beyond the head's predicted blindness
    distance, materialized, training length) and ``P_grad_beyond_blind_share/head{h}``
    (``|beyond| / (|beyond| + |within|)``, entry by entry). Rank 0 measures; the other ranks wait at their next
    collective.
    """

    def __init__(self, every_n_steps: int | None = 500, batch_size: int = 1) -> None:
        super().__init__(every_n_steps)
        self.batch_size = batch_size
        self.statistics: list[GradientStatistics] = []
        self.slope_grad: dict[str, torch.Tensor] = {}

    def evaluate(self, trainer: L.Trainer, pl_module: DecoderLM, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        decoder, dtype, length = pl_module.decoder, autocast_dtype(trainer), training_length(trainer, pl_module)
        logits, weights = [], []

        def keep(module, inputs, output):
            logits.append(inputs[0])
            weights.append(output)

        blocks = cast(list[Block], decoder.blocks)  # a ModuleList of Blocks
        hooks = forward_hooks([b.attn.weights for b in blocks], lambda _: keep)
        # validate and test run under inference mode, which enable_grad alone does not leave
        with evaluating(pl_module), hooks, torch.inference_mode(False), torch.enable_grad():
            tokens = datamodule_of(trainer).heldout_windows(self.batch_size, length).to(pl_module.device).clone()
            with trainer.precision_plugin.forward_context():
                hidden = decoder.hidden_states(tokens[:, :-1], attention="eager", softmax_dtype=dtype)
                loss = F.cross_entropy(decoder.lm_head(hidden).flatten(0, 1).float(), tokens[:, 1:].flatten())
            grads = torch.autograd.grad(loss, logits, retain_graph=True)
            self.statistics = [gradient_statistics(x, w, g) for x, w, g in zip(logits, weights, grads)]
            self.slope_grad = head_parameter_gradients(pl_module, logits, grads, length, dtype)
        scalars: dict[str, float] = {}
        for layer, stats in enumerate(self.statistics):
            for name, values in (
                ("grad_zero_given_zero_weight", stats.zero_given_zero_weight),
                ("grad_zero_given_nonzero_weight", stats.zero_given_nonzero_weight),
                ("grad_blind_distance", stats.grad_blind_distance),
                ("weight_blind_distance_1x", stats.weight_blind_distance),
            ):
                per_head(scalars, partial(gradient_tag, name, layer=layer, prefix=prefix), values)
        for name, values in self.slope_grad.items():
            per_head(scalars, partial(gradient_tag, name, prefix=prefix), values)
        log_scalars(trainer, pl_module, scalars, prefix)
        return scalars


def trained_behind(position) -> dict[str, torch.Tensor]:
    """Head parameter name -> the trained tensor it is computed from entry by entry (same shape), e.g. ALiBi's
    log-slopes behind ``slope``; a head parameter computed from shared parameters has none."""
    trained = [p for p in position.parameters() if p.requires_grad]
    behind = {}
    for name, value in position.learned_head_parameters().items():
        sources = torch.autograd.grad(value.sum(), trained, allow_unused=True) if value.requires_grad else []
        for p, g in zip(trained, sources):
            if g is not None and p.shape == value.shape:
                behind[name] = p
    return behind


def head_parameter_gradients(pl_module, logits, grads, length: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Per head, each learned head parameter's gradient, in total and from keys at or beyond its predicted
    blindness distance (logits are the only path from the position stack to the loss, so back-propagating masked
    logit gradients splits it exactly)."""
    position = pl_module.decoder.position
    behind = trained_behind(position)
    if not behind:
        return {}
    device = next(iter(behind.values())).device
    predicted = first_blind_token(
        predicted_blind_distances(position, length, dtype, pl_module.config.threshold, "materialized")
    )
    i = torch.arange(length, device=device)
    beyond = ((i[:, None] - i[None, :]) >= predicted.to(device)[:, None, None]).to(grads[0].dtype)
    total = torch.autograd.grad(logits, list(behind.values()), grads, retain_graph=True)
    far = torch.autograd.grad(logits, list(behind.values()), [g * beyond for g in grads])
    result = {}
    for name, all_of_it, beyond_blind in zip(behind, total, far):
        all_of_it, beyond_blind = per_head_entries(all_of_it), per_head_entries(beyond_blind)
        far_size, near_size = beyond_blind.abs().sum(-1), (all_of_it - beyond_blind).abs().sum(-1)
        result[f"{name}_grad"] = all_of_it.sum(-1)
        result[f"{name}_grad_beyond_blind"] = beyond_blind.sum(-1)
        result[f"{name}_grad_beyond_blind_share"] = far_size / (far_size + near_size)
    return result


def per_head_entries(gradient: torch.Tensor) -> torch.Tensor:
    """A gradient with the head first as (heads, entries), detached, in float64 on the CPU."""
    return gradient.detach().reshape(len(gradient), -1).double().cpu()
