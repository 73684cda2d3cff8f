"""Training tokens/s of the decoder against litgpt's ``GPT`` of the same Llama-style shape, on the CPU.

    python benchmarks/litgpt_throughput.py [--layers 4] [--hidden 256] [--heads 8] [--length 256] [--batch 8]
                                           [--threads N] [--steps 5] [--warmup 2] [--repeats 5]

One training step: forward, cross-entropy, backward, AdamW step, on the same batch for every model, at the same
thread count, eager (no ``torch.compile``) in every model, subnormals flushed as ``blindheads fit`` does. Warm-up
steps are not timed; each repetition times ``--steps`` steps of every model in turn (round-robin, so drift in the
machine's speed hits all alike). Prints each model's tokens/s (min, median and max over the repetitions), its
parameter count, and ours / litgpt for RoPE against RoPE; ALiBi and NoPE of ours run beside them.

litgpt is not a dependency of the project (its pins do not resolve with ours): its wheel goes, without its
dependencies (``litgpt.model`` needs only torch; ``import litgpt`` also takes lightning, which we have), into
``.bench/litgpt``, put on ``sys.path`` by this script only. ``make benchmark-litgpt`` installs it and runs this.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blindheads.modules import Decoder, DecoderConfig
from blindheads.numerics import apply_threshold

LITGPT_VERSION = "0.5.13"  # the version the figures in benchmarks/README.md were measured with
LITGPT_DIR = Path(__file__).resolve().parents[1] / ".bench" / "litgpt"  # git-ignored
INSTALL = f".venv/bin/pip install --no-deps --target .bench/litgpt litgpt=={LITGPT_VERSION}"
LITGPT = "litgpt GPT (rope)"
POSITIONS = ("rope", "alibi", "nope")  # ours: RoPE first, against litgpt's; ALiBi and NoPE beside them


@dataclass(frozen=True)
class Shape:
    """One Llama-style shape, built alike in both: pre-norm RMSNorm blocks, grouped-query attention, SwiGLU MLP, no
    biases, RoPE over the whole head (theta 10000), norm eps 1e-5, normal(0, 0.02) initial weights (litgpt's own
    ``_init_weights``). Embeddings untied in both unless ``tie``: litgpt's ``GPT`` unties its LM head, ours ties it by
    default; tied or not, the FLOPs are the same, only the parameters (and the AdamW step over them) differ."""

    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int | None = None  # None: heads (full multi-head attention)
    mlp: int | None = None  # None: 3 x hidden, as the project's configs
    length: int = 256
    vocab: int = 1024  # configs/experiments/laptop.yaml's builtin vocabulary: the blocks, not the LM head, dominate
    tie: bool = False

    @property
    def groups(self) -> int:
        return self.kv_heads or self.heads

    @property
    def mlp_size(self) -> int:
        return self.mlp or 3 * self.hidden

    def parameters(self) -> int:
        """What both models hold: embedding, per block two norms, q/k/v/o and the three MLP matrices, final norm,
        and the LM head when untied."""
        head = self.hidden // self.heads
        attention = self.hidden * (self.heads + 2 * self.groups) * head + self.heads * head * self.hidden
        block = 2 * self.hidden + attention + 3 * self.hidden * self.mlp_size
        return self.vocab * self.hidden * (1 if self.tie else 2) + self.layers * block + self.hidden


INIT_STD = 0.02  # litgpt's GPT._init_weights


def ours(shape: Shape, position: str) -> Decoder:
    """Our decoder of ``shape`` with the position stack ``position``, SDPA attention, float32."""
    config = DecoderConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.groups,
        mlp_size=shape.mlp_size,
        context_length=shape.length,
        init_std=INIT_STD,
        tie_embeddings=shape.tie,
        position=position,
        attention="sdpa",
        dtype="float32",
    )
    return Decoder(config)


@contextlib.contextmanager
def litgpt_on_path() -> Iterator[None]:
    """``.bench/litgpt`` on ``sys.path`` while importing; litgpt's own submodules import from its package's path
    afterwards, so nothing else in the process sees the folder."""
    folder = str(LITGPT_DIR)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def import_litgpt() -> ModuleType | None:
    """``litgpt.model`` from ``.bench/litgpt`` (or wherever it is installed), None when it is missing."""
    with litgpt_on_path():
        try:
            import litgpt.model
        except ImportError:
            return None
    return litgpt.model


def litgpt_gpt(shape: Shape, model: ModuleType) -> nn.Module:
    """litgpt's ``GPT`` of ``shape`` (``model``: the ``litgpt.model`` module), initialised as litgpt's pretraining
    does, its LM head tied to the embedding when ``shape.tie``."""
    config = model.Config(
        name="blindheads-shape",
        n_layer=shape.layers,
        n_head=shape.heads,
        n_query_groups=shape.groups,
        n_embd=shape.hidden,
        intermediate_size=shape.mlp_size,
        norm_class_name="RMSNorm",
        norm_eps=1e-5,
        mlp_class_name="LLaMAMLP",
        block_size=shape.length,
        vocab_size=shape.vocab,
        padded_vocab_size=shape.vocab,
        bias=False,
        rotary_percentage=1.0,
        rope_base=10000,
        parallel_residual=False,
    )
    gpt = model.GPT(config)
    gpt.apply(gpt._init_weights)
    if shape.tie:
        gpt.lm_head.weight = gpt.transformer.wte.weight
    return gpt


def build_models(shape: Shape, litgpt: ModuleType | None) -> dict[str, nn.Module]:
    """Ours for each of ``POSITIONS``, then litgpt's RoPE ``GPT`` when ``litgpt`` (``litgpt.model``) is given; every
    model starts from the same seed."""
    models: dict[str, nn.Module] = {}
    for position in POSITIONS:
        torch.manual_seed(0)
        models[f"ours ({position})"] = ours(shape, position)
    if litgpt is not None:
        torch.manual_seed(0)
        models[LITGPT] = litgpt_gpt(shape, litgpt)
    return models


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied LM head counted once, as ``parameters()`` yields it once)."""
    return sum(p.numel() for p in model.parameters())


class Trainer:
    """One model with its AdamW; ``step`` is a whole training step, returning the loss."""

    def __init__(self, model: nn.Module, lr: float = 1e-3) -> None:
        self.model = model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)

    def step(self, inputs: Tensor, targets: Tensor) -> float:
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def timed(self, inputs: Tensor, targets: Tensor, steps: int) -> tuple[float, list[float]]:
        """Seconds for ``steps`` steps, and their losses."""
        start = time.perf_counter()
        losses = [self.step(inputs, targets) for _ in range(steps)]
        return time.perf_counter() - start, losses


def batch(shape: Shape, size: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random tokens: inputs (size, length) and the next tokens as targets."""
    tokens = torch.randint(0, shape.vocab, (size, shape.length + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def measure(
    trainers: dict[str, Trainer],
    inputs: Tensor,
    targets: Tensor,
    steps: int,
    warmup: int,
    repeats: int,
    log: Callable[[str], None] = print,
) -> dict[str, list[float]]:
    """Tokens/s of each trainer per repetition; warm-up steps untimed, the order rotated each repetition."""
    for trainer in trainers.values():
        for _ in range(warmup):
            trainer.step(inputs, targets)
    names, rates = list(trainers), {name: [] for name in trainers}
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            seconds, losses = trainers[name].timed(inputs, targets, steps)
            if not all(map(torch.isfinite, map(torch.tensor, losses))):
                raise RuntimeError(f"{name}: a non-finite loss in {losses}")
            rates[name].append(inputs.numel() * steps / seconds)
        log(f"  repetition {repeat + 1}/{repeats}: " + ", ".join(f"{n} {r[-1]:,.0f}" for n, r in rates.items()))
    return rates


def report(rates: dict[str, list[float]], parameters: dict[str, int]) -> list[str]:
    """The table: tokens/s min, median and max per model, its parameters, x litgpt (medians); then the ratio."""
    lines = [f"{'model':<20} {'min':>9} {'median':>9} {'max':>9}  tokens/s  {'parameters':>11} {'x litgpt':>8}"]
    reference = statistics.median(rates[LITGPT]) if LITGPT in rates else None
    for name, values in rates.items():
        median = statistics.median(values)
        ratio = f"{median / reference:>8.2f}" if reference else f"{'-':>8}"
        lines.append(
            f"{name:<20} {min(values):>9,.0f} {median:>9,.0f} {max(values):>9,.0f}            "
            f"{parameters[name]:>11,} {ratio}"
        )
    if reference:
        paired = [a / b for a, b in zip(rates["ours (rope)"], rates[LITGPT])]
        lines.append(
            f"ours (rope) / litgpt (rope) tokens/s: {statistics.median(rates['ours (rope)']) / reference:.2f} "
            f"(medians; per repetition {min(paired):.2f}-{max(paired):.2f})"
        )
    return lines


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Shape()
    parser.add_argument("--layers", type=int, default=default.layers)
    parser.add_argument("--hidden", type=int, default=default.hidden)
    parser.add_argument("--heads", type=int, default=default.heads)
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    parser.add_argument("--mlp", type=int, default=None, help="SwiGLU hidden width (default: 3 x --hidden)")
    parser.add_argument("--length", type=int, default=default.length, help="tokens per sequence (= block size)")
    parser.add_argument("--vocab", type=int, default=default.vocab)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, the cores)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per model per repetition")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions, round-robin over the models")
    parser.add_argument("--tie-embeddings", action="store_true", help="tie the LM head to the embedding in both")
    parser.add_argument("--without-litgpt", action="store_true", help="ours only (litgpt not installed)")
    parser.add_argument("--profile", metavar="MODEL", help="instead: profile one step of MODEL (e.g. 'ours (rope)')")
    return parser.parse_args(argv)


def profile(trainer: Trainer, inputs: Tensor, targets: Tensor, warmup: int) -> str:
    """torch.profiler's table of one step after ``warmup`` steps, by self CPU time."""
    for _ in range(warmup):
        trainer.step(inputs, targets)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.step(inputs, targets)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    apply_threshold("normal")  # before any thread starts, as blindheads fit does
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = Shape(args.layers, args.hidden, args.heads, args.kv_heads, args.mlp, args.length, args.vocab,
                  args.tie_embeddings)  # fmt: skip
    litgpt = None if args.without_litgpt else import_litgpt()
    if litgpt is None and not args.without_litgpt:
        print(
            f"litgpt is not installed: `make benchmark-litgpt`, or `{INSTALL}` (or --without-litgpt)", file=sys.stderr
        )
        return 2
    models = build_models(shape, litgpt)
    parameters = {name: count_parameters(model) for name, model in models.items()}
    inputs, targets = batch(shape, args.batch)
    trainers = {name: Trainer(model) for name, model in models.items()}
    print(
        f"{shape.layers} layers x {shape.hidden} hidden, {shape.heads} heads ({shape.groups} kv), MLP {shape.mlp_size}, "
        f"vocab {shape.vocab}, batch {args.batch} x {shape.length} tokens; {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
        + (f", litgpt {litgpt_version()}" if litgpt else "")
        + "\nAdamW step included, eager (no torch.compile) in every model, SDPA attention, float32, subnormals flushed; "
        + ("embeddings tied in both" if shape.tie else "embeddings untied in both (litgpt's way; ours ties by default)")
        + f": same FLOPs and {shape.parameters():,} parameters in each"
    )
    if args.profile:
        print(profile(trainers[args.profile], inputs, targets, args.warmup))
        return 0
    print(f"{args.warmup} warm-up steps, then {args.repeats} repetitions of {args.steps} timed steps per model")
    rates = measure(trainers, inputs, targets, args.steps, args.warmup, args.repeats)
    print("\n".join(report(rates, parameters)))
    return 0


def litgpt_version() -> str:
    import importlib.metadata

    with litgpt_on_path():
        return importlib.metadata.version("litgpt")


if __name__ == "__main__":
    sys.exit(main())
