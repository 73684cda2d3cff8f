"""Forward+backward tokens/s of the decoder for each position setup, and of transformers' Llama of the same shape.

    python benchmarks/decoder_throughput.py [--layers 4] [--length 1024] [--batch 2] [--rounds 5] [--attention sdpa]
                                            [--keep-subnormals]

Prints one row per setup with its step time relative to NoPE (goal: ALiBi and every mitigation <= 1.10x) and
ours-vs-Llama (goal: RoPE at least as fast as ``LlamaForCausalLM``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaForCausalLM

from blindheads.export.llama import llama_config
from blindheads.modules import Decoder, DecoderConfig
from blindheads.numerics import apply_threshold

LLAMA = "transformers LlamaForCausalLM"
SETUPS = [
    "nope",
    "rope",
    "alibi",
    "alibi(steep)",
    "alibi(safe)",
    "alibi(wide)",
    "alibi(robust)",
    "alibi(learnable=True)",
    "alibi+clamp",
    "alibi+log_distance",
    "alibi+soft_cap(30)",
    "alibi+soft_cap(30, where=before)",
    "alibi+sliding_window(256)",
    "alibi(wide)+clamp+log_distance",
]


def step_seconds(model: torch.nn.Module, tokens: torch.Tensor) -> float:
    start = time.perf_counter()
    logits = model(tokens)
    logits = getattr(logits, "logits", logits)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def median_step_seconds(models: dict[str, torch.nn.Module], tokens: torch.Tensor, rounds: int) -> dict[str, float]:
    """Round-robin over the models, so that drift in the machine's speed hits every setup alike."""
    times = {name: [] for name in models}
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, model in models.items():
            seconds = step_seconds(model, tokens)
            if round_:
                times[name].append(seconds)
    return {name: statistics.median(values) for name, values in times.items()}


def llama_like(config: DecoderConfig) -> LlamaForCausalLM:
    """transformers' Llama of the same shape (the export's mapping), with RoPE and SDPA attention."""
    return LlamaForCausalLM(llama_config(config, 10000.0, attn_implementation="sdpa"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="layers of the smollm-148m shape (all 30: slow on CPU)")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per setup, interleaved")
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "eager", "flex"])
    parser.add_argument(
        "--keep-subnormals",
        action="store_true",
        help="do not flush subnormals (blindheads fit flushes them; CPU arithmetic on them is slow)",
    )
    args = parser.parse_args()
    apply_threshold("subnormal" if args.keep_subnormals else "normal")  # before any thread starts
    torch.manual_seed(0)
    shape = {"num_layers": args.layers, "context_length": max(args.length, 2048), "attention": args.attention}
    tokens = torch.randint(0, 49152, (args.batch, args.length))
    n_tokens = tokens.numel()
    print(
        f"smollm-148m shape with {args.layers} layers, batch {args.batch} x {args.length} tokens, "
        f"{args.attention}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"subnormals {'kept' if args.keep_subnormals else 'flushed'}"
    )
    models = {spec: Decoder(DecoderConfig.from_preset("smollm-148m", position=spec, **shape)) for spec in SETUPS}
    models[LLAMA] = llama_like(DecoderConfig.from_preset("smollm-148m", **shape))
    results = median_step_seconds(models, tokens, args.rounds)
    llama = results.pop(LLAMA)
    print(f"{'setup':<34} {'step s':>8} {'tokens/s':>9} {'x NoPE':>7}")
    for spec, seconds in results.items():
        print(f"{spec:<34} {seconds:>8.3f} {n_tokens / seconds:>9.0f} {seconds / results['nope']:>7.2f}")
    print(f"{LLAMA:<34} {llama:>8.3f} {n_tokens / llama:>9.0f} {llama / results['nope']:>7.2f}")
    print(f"ours (rope) / Llama step time: {results['rope'] / llama:.2f}")
    additive = max(seconds / results["nope"] for spec, seconds in results.items() if "soft_cap" not in spec)
    soft_caps = max(seconds / results["nope"] for spec, seconds in results.items() if "soft_cap" in spec)
    for goal, value, limit in (
        ("every additive stack <= 1.10x NoPE", additive, 1.10),
        ("soft caps <= 1.30x NoPE", soft_caps, 1.30),
        ("RoPE at least as fast as Llama", results["rope"] / llama, 1.0),
    ):
        print(f"goal: {goal}: worst {value:.2f} -> {'met' if value <= limit else 'NOT met'}")


if __name__ == "__main__":
    main()
