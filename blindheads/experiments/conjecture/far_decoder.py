"""The conjecture's decoder arm: the bare head's task in the project's own decoder, pretrained on near recall.

Episodes are those of the bare head (``far_head.episodes``: filler tokens, one digit, a query token whose next token
is the digit). The decoder attends through ``step(NEAR, B)``: flat within NEAR tokens, so near recall is learned the
same way whatever comes beyond. Each seed pretrains once on near episodes (the digit 8-32 tokens back) with every key
beyond NEAR masked; every condition then starts from those weights and trains on far episodes (the digit 96-128 back)
with a step of -B beyond NEAR (or still masked). So each condition asks only: does a decoder that can recall learn to
reach across a gap of B nats?
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor

from blindheads.experiments.conjecture.far_head import FAR, FILLER, LENGTH, MASKED, NEAR, VOCAB, bias_value, episodes
from blindheads.modules.backends import AttentionWeights
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder
from blindheads.numerics import flushing_subnormals

NEAR_BACK = (8, NEAR)  # where the digit lies in pretraining
BATCH, EVAL, LR = 32, 256, 3e-3


def position(condition: str) -> str:
    """The position spec of a condition: a step of B beyond NEAR, or every key beyond NEAR masked."""
    if condition == MASKED:
        return f"sliding_window({NEAR + 1})"
    return f"step({NEAR}, {bias_value(condition)!r})"


def decoder(condition: str) -> Decoder:
    config = DecoderConfig(vocab_size=VOCAB, context_length=LENGTH + 1, position=position(condition),
                           attention="sdpa", dtype="float32", threshold="normal", hidden_size=64, num_layers=2,
                           num_heads=4, mlp_size=128, init_std=0.02)  # fmt: skip
    return Decoder(config)


def answer_logits(model: Decoder, tokens: Tensor) -> Tensor:
    """The logits of the token after the query (what the digit is read from)."""
    return model(tokens)[:, -1]


def train_seed(seed: int, conditions: list[str], pretrain_steps: int, steps: int, every: int) -> dict:
    """Pretrain on near episodes, then train each condition on far ones (until it holds 0.9, at most ``steps``);
    per condition the far-accuracy curve, steps to 0.9, the far weight (largest over layer-heads, mean over held-out episodes) at the start and end, and
    the gradient reaching the digit's token at the first step. Subnormals flushed, as fused GPU kernels do."""
    with flushing_subnormals():
        torch.manual_seed(seed)
        base = decoder(MASKED)
        near_eval = episodes(EVAL, torch.Generator().manual_seed(30_000 + seed), NEAR_BACK)
        pretrained = _fit(base, torch.Generator().manual_seed(40_000 + seed), NEAR_BACK, pretrain_steps, near_eval,
                          every)  # fmt: skip
        far_eval = episodes(EVAL, torch.Generator().manual_seed(20_000 + seed))
        constant = torch.bincount(far_eval[1], minlength=10).max().item() / EVAL  # the best constant answer's score
        rows = []
        for condition in conditions:
            model = decoder(condition)
            model.load_state_dict(copy.deepcopy(base.state_dict()))
            start = _far_weight(model, far_eval)
            gradient = _digit_gradient(model, episodes(BATCH, torch.Generator().manual_seed(50_000 + seed)))
            curve = _fit(model, torch.Generator().manual_seed(10_000 + seed), FAR, steps, far_eval, every, settle=True)
            reached = next((s for s, a in zip(curve["step"], curve["accuracy"]) if a >= 0.9), None)
            rows.append({
                "condition": condition, "bias": bias_value(condition), "seed": seed, "steps_to_0.9": reached,
                "final_accuracy": curve["accuracy"][-1], "constant_accuracy": constant, "far_weight_start": start,
                "far_weight_end": _far_weight(model, far_eval), "digit_gradient": gradient, "curve": curve,
            })  # fmt: skip
        return {"pretrain": pretrained, "rows": rows}


def _fit(model: Decoder, data: torch.Generator, back: tuple[int, int], steps: int, held_out, every: int,
         settle: bool = False) -> dict:  # fmt: skip
    """Adam on the answer's cross-entropy; held-out accuracy every ``every`` steps and at the end. ``settle``: stop
    once two measurements in a row are >= 0.9 (a condition that has learned costs no more)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    curve: dict[str, list] = {"step": [], "accuracy": []}
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            curve["step"].append(step)
            curve["accuracy"].append(_accuracy(model, held_out))
        if step == steps or (settle and len(curve["accuracy"]) > 1 and min(curve["accuracy"][-2:]) >= 0.9):
            break
        tokens, digits, _ = episodes(BATCH, data, back)
        loss = F.cross_entropy(answer_logits(model, tokens), _target(digits))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return curve


def _target(digits: Tensor) -> Tensor:
    return digits + FILLER  # the digits' token ids follow the filler's


@torch.no_grad()
def _accuracy(model: Decoder, held_out) -> float:
    tokens, digits, _ = held_out
    return (answer_logits(model, tokens).argmax(-1) == _target(digits)).double().mean().item()


@torch.no_grad()
def _far_weight(model: Decoder, held_out) -> float:
    """The largest, over layers and heads, of the mean weight the query puts on the digit."""
    tokens, _, back = held_out
    captured: list[Tensor] = []
    hooks = [module.register_forward_hook(lambda m, i, o: captured.append(o[:, :, -1]))
             for module in model.modules() if isinstance(module, AttentionWeights)]  # fmt: skip
    try:
        model(tokens, attention="eager")  # the backend whose softmax the hooks see
    finally:
        for hook in hooks:
            hook.remove()
    digit = (LENGTH - back)[:, None, None].expand(-1, captured[0].shape[1], 1)
    return max(w.gather(2, digit).squeeze(2).double().mean(0).max().item() for w in captured)


def _digit_gradient(model: Decoder, batch) -> float:
    """Mean norm of the loss gradient at the digit's input embedding: all that reaches the far fact."""
    tokens, digits, back = batch
    embedded: list[Tensor] = []

    def keep(module, inputs, output: Tensor) -> None:
        output.retain_grad()
        embedded.append(output)

    hook = model.embed.register_forward_hook(keep)
    try:
        F.cross_entropy(answer_logits(model, tokens), _target(digits)).backward()
    finally:
        hook.remove()
    model.zero_grad(set_to_none=True)
    gradient = embedded[0].grad
    assert gradient is not None  # kept by ``retain_grad``
    gradient = gradient[torch.arange(len(tokens)), LENGTH - back]
    return gradient.double().norm(dim=-1).mean().item()  # in float64: squares of 1e-20 underflow float32
