"""The conjecture's bare-head arm: one attention head, the far fact the only signal, a step bias -B in front of it.

Each episode is ``LENGTH`` random filler tokens with one digit ``FAR`` tokens back (the only digit), then a query
token; the head reads from the query and must name the digit. Keys within ``NEAR`` tokens get bias 0, keys farther
back -B, so the digit's weight starts at about ``exp(-B) / NEAR``: B sets the dose. Nothing but the head can see the
digit, so the head learns to find it through that weight or not at all.

Every condition (B) and seed trains at once as one batch of independent models: a parameter tensor has a model axis,
the loss is the sum of the models' mean losses, and Adam and SGD act element by element, so each model's updates are
exactly those it would get alone. The models of one seed share their initial weights and every batch (paired by
seed); only B differs. Attention needs only the query's row: a model's keys and values are those of its vocabulary,
gathered per token, so a step costs microseconds per model.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from blindheads.numerics import flushing_subnormals, tau

FILLER, DIGITS = 64, 10  # filler token ids 0..63, digits 64..73, the query token 74
VOCAB = FILLER + DIGITS + 1
WIDTH = 32  # embedding and head width
LENGTH = 128  # tokens before the query
NEAR = 32  # keys this close (in tokens back) get bias 0
FAR = (96, 128)  # the digit lies this many tokens back (inclusive)
BATCH = 32  # training episodes per model and step
EVAL = 512  # held-out episodes per seed, the same at every measurement
DENSE = 2000  # measured every ``every`` steps up to here (where learning happens), every 20 x ``every`` after
MASKED = "masked"  # the condition whose far keys are masked out: weight exactly 0, no path at all
FLUSH_EDGE = "tau"  # B = tau(float32, normal): the far weight is exactly 0 in float32 with subnormals flushed


@dataclass(frozen=True)
class Arm:
    """How the head trains: optimizer, its learning rate and Adam's eps, the dtype of the whole computation."""

    optimizer: str
    lr: float
    eps: float = 1e-8
    dtype: torch.dtype = torch.float32


ARMS = {
    "adam": Arm("adam", 1e-2),
    "adam_tiny_eps": Arm("adam", 1e-2, eps=1e-20),  # Adam divides by ~|gradient| + eps: tiny gradients, full steps
    "float64": Arm("adam", 1e-2, dtype=torch.float64),
    "float64_tiny_eps": Arm("adam", 1e-2, eps=1e-20, dtype=torch.float64),
    "sgd": Arm("sgd", 0.3),  # the largest of 0.1, 0.3, 1, 10, 100 at which B = 0 learned in a pilot (1 diverged)
}


def bias_value(condition: str) -> float:
    """The step's height B for a condition name: a number, ``tau`` (the float32 flush edge) or ``masked`` (inf)."""
    if condition == MASKED:
        return math.inf
    if condition == FLUSH_EDGE:
        return tau("float32", "normal")
    try:
        value = float(condition)
    except ValueError:
        raise ValueError(f"unknown bias {condition!r}; valid: a number >= 0, {FLUSH_EDGE}, {MASKED}") from None
    if not value >= 0:
        raise ValueError(f"bias {condition!r} must be >= 0")
    return value


def episodes(count: int, generator: torch.Generator, back: tuple[int, int] = FAR) -> tuple[Tensor, Tensor, Tensor]:
    """``count`` episodes: tokens (count, LENGTH + 1) ending with the query, the digit (0-9) and how far back it
    lies (within ``back``, inclusive)."""
    tokens = torch.randint(0, FILLER, (count, LENGTH + 1), generator=generator)
    digit = torch.randint(0, DIGITS, (count,), generator=generator)
    distance = torch.randint(back[0], back[1] + 1, (count,), generator=generator)
    tokens[torch.arange(count), LENGTH - distance] = FILLER + digit
    tokens[:, LENGTH] = VOCAB - 1
    return tokens, digit, distance


def step_bias(biases: Tensor, dtype: torch.dtype) -> Tensor:
    """(models, LENGTH) bias of each key position as seen from the query: 0 within NEAR tokens, -B beyond."""
    back = LENGTH - torch.arange(LENGTH)
    far = (back > NEAR).to(torch.float64)
    return torch.where(far.bool(), -biases[:, None].to(torch.float64) * far, 0.0).to(dtype)


class Heads:
    """One attention head per model: embeddings, query/key/value maps and a readout to the ten digits."""

    def __init__(self, seeds: list[int], copies: int, dtype: torch.dtype) -> None:
        """Each seed's initial weights, repeated ``copies`` times (one per condition), seeds outermost."""
        shapes = {"embed": (VOCAB, WIDTH), "digit": (1, WIDTH), "query": (WIDTH, WIDTH), "key": (WIDTH, WIDTH), "value": (WIDTH, WIDTH),
                  "readout": (WIDTH, DIGITS)}  # fmt: skip
        scale = {"embed": 1.0, "digit": 1.0}
        per_seed = []
        for seed in seeds:
            generator = torch.Generator().manual_seed(seed)
            per_seed.append({name: torch.randn(shape, generator=generator, dtype=torch.float64)
                             * scale.get(name, shape[0] ** -0.5) for name, shape in shapes.items()})  # fmt: skip
        self.params = {
            name: torch.stack([p[name] for p in per_seed]).repeat_interleave(copies, 0).to(dtype).requires_grad_()
            for name in shapes
        }

    def table(self) -> Tensor:
        """Every token's embedding (models, VOCAB, WIDTH); the digits' share a learned "digit" direction, as the
        numbers of a trained model's vocabulary do, so finding a digit is one skill, not ten."""
        is_digit = torch.zeros(VOCAB, 1, dtype=self.params["embed"].dtype)
        is_digit[FILLER : FILLER + DIGITS] = 1
        return self.params["embed"] + is_digit * self.params["digit"]

    def forward(self, tokens: Tensor, bias: Tensor) -> dict[str, Tensor]:
        """For tokens (models, batch, LENGTH + 1): the query's attention weights over the LENGTH keys, its scores,
        its output (before the readout) and the digit logits."""
        p = self.params
        table = self.table()  # (models, VOCAB, WIDTH)
        query = torch.einsum("mw,mwv->mv", table[:, -1], p["query"])  # the query token's, the same in every episode
        key_scores = torch.einsum("mvw,mw->mv", table @ p["key"], query) / math.sqrt(WIDTH)  # per vocabulary entry
        keys = tokens[..., :LENGTH]
        scores = torch.gather(key_scores, 1, keys.flatten(1)).view(keys.shape) + bias[:, None, :]
        weights = torch.softmax(scores, dim=-1)
        per_token = torch.zeros(*keys.shape[:2], VOCAB, dtype=weights.dtype).scatter_add_(2, keys, weights)
        output = per_token @ (table @ p["value"])  # (models, batch, WIDTH)
        return {"scores": scores, "weights": weights, "output": output, "logits": output @ p["readout"]}


def train(arm: Arm, conditions: list[str], seeds: list[int], steps: int, every: int) -> dict:
    """Train every condition at every seed for ``steps`` steps, measuring held-out accuracy and the far weight at
    step 0, every ``every`` steps up to DENSE, every 20 x ``every`` after, and at the end; the gradient reaching the
    digit's key and value at step 0. Float32 runs flush
    subnormals, as fused GPU kernels do."""
    with torch.no_grad():
        biases = torch.tensor([bias_value(c) for c in conditions], dtype=torch.float64).repeat(len(seeds))
    models = len(seeds) * len(conditions)
    bias = step_bias(biases, arm.dtype)
    heads = Heads(seeds, len(conditions), arm.dtype)
    params = list(heads.params.values())
    optimizer = (torch.optim.Adam(params, lr=arm.lr, eps=arm.eps, foreach=True) if arm.optimizer == "adam"
                 else torch.optim.SGD(params, lr=arm.lr, foreach=True))  # fmt: skip
    generators = [torch.Generator().manual_seed(10_000 + seed) for seed in seeds]
    held_out = [episodes(EVAL, torch.Generator().manual_seed(20_000 + seed)) for seed in seeds]
    eval_tokens = _per_model(torch.stack([e[0] for e in held_out]), len(conditions))
    eval_digits = _per_model(torch.stack([e[1] for e in held_out]), len(conditions))
    eval_back = _per_model(torch.stack([e[2] for e in held_out]), len(conditions))
    curve: dict[str, list] = {"step": [], "accuracy": [], "far_weight": [], "far_weight_zero": []}
    gradient: dict[str, Tensor] = {}
    with flushing_subnormals() if arm.dtype == torch.float32 else contextlib.nullcontext():
        for step in range(steps + 1):
            if step % (every if step <= DENSE else 20 * every) == 0 or step == steps:
                _measure(heads, eval_tokens, eval_digits, eval_back, bias, step, curve)
            if step == steps:
                break
            batch = [episodes(BATCH, g) for g in generators]
            tokens = _per_model(torch.stack([b[0] for b in batch]), len(conditions))
            digits = _per_model(torch.stack([b[1] for b in batch]), len(conditions))
            out = heads.forward(tokens, bias)
            if step == 0:
                out["scores"].retain_grad()
                out["output"].retain_grad()
            loss = F.cross_entropy(out["logits"].flatten(0, 1), digits.flatten(), reduction="none")
            optimizer.zero_grad(set_to_none=True)
            loss.view(models, BATCH).mean(1).sum().backward()
            if step == 0:
                gradient = _far_gradients(heads, out, tokens)
            optimizer.step()
    constant = [torch.bincount(e[1], minlength=DIGITS).max().item() / EVAL for e in held_out]
    return _record(conditions, seeds, biases, curve, gradient, constant)


def _per_model(per_seed: Tensor, copies: int) -> Tensor:
    return per_seed.repeat_interleave(copies, 0)


@torch.no_grad()
def _measure(heads: Heads, tokens: Tensor, digits: Tensor, back: Tensor, bias: Tensor, step: int, curve: dict) -> None:
    out = heads.forward(tokens, bias)
    far = out["weights"].gather(2, (LENGTH - back)[..., None]).squeeze(2)  # the weight on the digit
    curve["step"].append(step)
    curve["accuracy"].append((out["logits"].argmax(-1) == digits).double().mean(1).tolist())
    curve["far_weight"].append(far.double().mean(1).tolist())
    curve["far_weight_zero"].append((far == 0).double().mean(1).tolist())


def _far_gradients(heads: Heads, out: dict[str, Tensor], tokens: Tensor) -> dict[str, Tensor]:
    """Mean norm, over the batch, of the loss gradient with respect to the digit's key and its value vector (at the
    digit's position: what reaches that token through this head), and the share of episodes where both are 0."""
    with torch.no_grad():
        is_digit = (tokens[..., :LENGTH] >= FILLER) & (tokens[..., :LENGTH] < FILLER + DIGITS)
        query = torch.einsum("mw,mwv->mv", heads.table()[:, -1], heads.params["query"])
        scores, output = out["scores"].grad, out["output"].grad  # kept by ``retain_grad`` at step 0
        assert scores is not None and output is not None
        score_grad = (scores * is_digit).sum(-1)  # (models, batch): d loss / d score of the digit
        key = score_grad.abs() * query.norm(dim=-1, keepdim=True) / math.sqrt(WIDTH)
        weight = (out["weights"] * is_digit).sum(-1)
        value = weight * output.norm(dim=-1)
        return {"key": key.double().mean(1), "value": value.double().mean(1),
                "zero": ((key == 0) & (value == 0)).double().mean(1)}  # fmt: skip


def _record(conditions: list[str], seeds: list[int], biases: Tensor, curve: dict, gradient: dict,
            constant: list[float]) -> dict:  # fmt: skip
    """Per condition and seed: B, the curves, steps to 0.9 held-out accuracy (None: never), final accuracy beside
    the best constant answer's, starting and final far weight, and the gradient reaching the digit at step 0."""
    rows = []
    for index in range(len(seeds) * len(conditions)):
        seed, condition = seeds[index // len(conditions)], conditions[index % len(conditions)]
        accuracy = [a[index] for a in curve["accuracy"]]
        reached = next((s for s, a in zip(curve["step"], accuracy) if a >= 0.9), None)
        rows.append({
            "condition": condition, "bias": float(biases[index]), "seed": seed,
            "steps_to_0.9": reached, "final_accuracy": accuracy[-1],
            "constant_accuracy": constant[index // len(conditions)],
            "far_weight_start": curve["far_weight"][0][index], "far_weight_end": curve["far_weight"][-1][index],
            "far_weight_zero_start": curve["far_weight_zero"][0][index],
            "far_weight_zero_end": curve["far_weight_zero"][-1][index],
            "key_gradient": float(gradient["key"][index]), "value_gradient": float(gradient["value"][index]),
            "gradient_zero": float(gradient["zero"][index]),
            "curve": {"step": curve["step"], "accuracy": [round(a, 4) for a in accuracy]},
        })  # fmt: skip
    return {"rows": rows}
