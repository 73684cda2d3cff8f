"""The GPU paths in one run: prints one table, writes JSON after every part.

Parts, in order, with the time each is expected to take on one H100/H200 (estimates until a first run replaces
them; the run prints the plan and each part's real time):

1. backends (~120 s): flex vs sdpa vs eager, outputs and gradients, for every position component and the paper's
   combinations (tiny model, float32; flex compiles once per setup);
2. zero_thresholds (~60 s): softmax zero thresholds (fp32, bf16, fp16) under FlexAttention, SDPA's flash and
   memory-efficient kernels and the eager softmax, beside ``tau`` in both modes (40 bisection steps each);
3. training (~240 s): compiled flex + bf16 steps of the 148M shape (30 layers, 8 x 2048 tokens): tokens/s, MFU,
   peak memory, compile time, ALiBi / NoPE / RoPE / a combination side by side;
4. probe_7b (~90 s): the probe's peak memory on a random BLOOM-7B1-shaped model (bf16) at 2048 tokens.

``--budget-s`` skips a part whose expected time no longer fits (it is named in the JSON), so a short lease measures
what fits and loses nothing: the JSON is rewritten after every part.

``--smoke`` runs every part's code at tiny size on the CPU (what CI does): backends eager against sdpa (the CPU has
no flex backward, and compiling flex per setup on a CPU takes minutes, so flex is left out there), training steps
uncompiled with the same loop, optimizer and MFU arithmetic, the bisection with the eager kernel, and the probe on a
tiny BLOOM. Peak memory is CUDA's alone: on the CPU it is null. Without ``--smoke`` and without a CUDA GPU nothing is
measured (exit status 2): nothing here is faked on a CPU.

    python benchmarks/gpu_check.py [--out gpu_check.json] [--budget-s 600] [--steps 10] [--batch 8] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass

import torch

from blindheads.modules import Decoder, DecoderConfig
from blindheads.numerics import DTYPES, tau

SPECS = [
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
    "alibi+soft_cap",
    "alibi+soft_cap(where=before)",
    "alibi+sliding_window(256)",
    "alibi+clamp+log_distance",
    "alibi(wide)+clamp+log_distance",
]
TRAINING = ["nope", "rope", "alibi", "alibi(wide)+clamp+log_distance"]
EXPECTED_S = {"backends": 120, "zero_thresholds": 60, "training": 240, "probe_7b": 90}  # on an H100/H200


@dataclass(frozen=True)
class Target:
    """The one device switch: what runs on CUDA only (synchronize, peak memory, flex backward, flash kernels)."""

    device: torch.device
    smoke: bool

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None

    def allocated_gib(self) -> float | None:
        return torch.cuda.memory_allocated() / 2**30 if self.cuda else None

    @property
    def attentions(self) -> tuple[str, ...]:
        """Backends compared with eager: flex needs CUDA for its backward."""
        return ("sdpa", "flex") if self.cuda else ("sdpa",)

    @property
    def kernels(self) -> tuple[str, ...]:
        return ("flex", "flash", "efficient", "eager") if self.cuda else ("eager",)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON goes (default: %(default)s)")
    parser.add_argument(
        "--steps", type=int, default=10, help="timed training steps per setup after 3 warm-up (%(default)s)"
    )
    parser.add_argument("--batch", type=int, default=8, help="windows of 2048 tokens per training step (%(default)s)")
    parser.add_argument("--layers", type=int, default=30, help="layers of the 148M shape (%(default)s)")
    parser.add_argument("--budget-s", type=float, default=None, help="skip parts that would not fit (default: none)")
    parser.add_argument("--smoke", action="store_true", help="every part at tiny size, on the CPU where no GPU is")
    return parser.parse_args(argv)


def backends_agree(target: Target, args: argparse.Namespace) -> list[dict]:
    """Max abs difference of the other backends against eager (float32, tiny model), outputs and gradients."""
    rows, tokens = [], torch.randint(0, 512, (2, 256 if not args.smoke else 64), device=target.device)
    for spec in SPECS:
        results = {}
        for attention in ("eager", *target.attentions):
            torch.manual_seed(0)
            config = DecoderConfig.from_preset(
                "tiny", position=spec, attention=attention, context_length=512, dtype="float32"
            )
            model = Decoder(config).to(target.device)
            logits = model(tokens)
            logits.pow(2).mean().backward()
            results[attention] = (logits.detach(), {n: p.grad for n, p in model.named_parameters()})
        row = {"spec": spec}
        for attention in target.attentions:
            out, grads = results[attention]
            row[f"{attention}_output"] = (out - results["eager"][0]).abs().max().item()
            row[f"{attention}_grad"] = max((g - results["eager"][1][n]).abs().max().item() for n, g in grads.items())
        rows.append(row)
    return rows


def training_steps(target: Target, args: argparse.Namespace) -> list[dict]:
    """Training steps: forward, backward, AdamW (fused on CUDA). On CUDA compiled flex under bf16 autocast at the
    148M shape; in ``--smoke`` the tiny shape, uncompiled sdpa, float32 on the CPU."""
    from lightning.fabric.utilities.throughput import get_available_flops

    from blindheads.modules.lm import DecoderLM

    preset, length = ("tiny", 128) if args.smoke else ("smollm-148m", 2048)
    batch, steps = (2, 2) if args.smoke else (args.batch, args.steps)
    rows = []
    for spec in TRAINING:
        torch.manual_seed(0)
        attention = "flex" if target.cuda else "sdpa"
        dtype = "bfloat16" if target.cuda else "float32"
        layers = 2 if args.smoke else args.layers
        config = DecoderConfig.from_preset(preset, position=spec, attention=attention, num_layers=layers, dtype=dtype)
        lm = DecoderLM(config, compile=target.cuda).to(target.device)
        optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-4, fused=target.cuda)
        windows = torch.randint(0, config.vocab_size, (batch, length + 1), device=target.device)
        target.reset_peak()
        times = []
        for _step in range(3 + steps):
            target.synchronize()
            start = time.perf_counter()
            with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=target.cuda):
                loss = lm.loss(windows)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            target.synchronize()
            times.append(time.perf_counter() - start)
        step_s = sorted(times[3:])[len(times[3:]) // 2]
        tokens = batch * length
        peak = get_available_flops(target.device, torch.bfloat16) if target.cuda else None
        mfu = lm.flops_per_token(length) * tokens / step_s / peak if peak else float("nan")
        rows.append({
            "spec": spec, "step_s": step_s, "tokens_per_s": tokens / step_s, "mfu": mfu,
            "peak_memory_gib": target.peak_gib(), "first_step_s": times[0],  # the first step compiles
        })  # fmt: skip
        del lm, optimizer
        if target.cuda:
            torch.cuda.empty_cache()
    nope = next(r["step_s"] for r in rows if r["spec"] == "nope")
    for row in rows:
        row["x_nope"] = row["step_s"] / nope
    return rows


def two_key_weight(gap: float, dtype: torch.dtype, kernel: str, device: torch.device) -> float:
    """The weight a kernel gives the key whose score is ``gap`` below the other's (scores from q.k, so no mask)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from blindheads.modules.backends import compiled_flex_attention

    head = 64
    q = torch.zeros(1, 1, 128, head, device=device, dtype=dtype)
    q[..., 0] = math.sqrt(head)
    k = torch.zeros(1, 1, 128, head, device=device, dtype=dtype)
    k[:, :, 1:, 0] = -gap  # key 0 scores 0, every other key -gap
    v = torch.zeros(1, 1, 128, head, device=device, dtype=dtype)
    v[:, :, 1:, 0] = 1.0  # the output's first channel is the total weight of the keys at -gap
    if kernel == "eager":
        weights = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(head), dim=-1)
        return weights[0, 0, 0, 1].item()
    if kernel == "flex":
        out = compiled_flex_attention()(q, k, v)
    else:
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[kernel]
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return out[0, 0, 0, 0].item()


def zero_thresholds(target: Target, args: argparse.Namespace) -> list[dict]:
    """Per dtype and kernel, the smallest logit gap whose weight is exactly zero (bisection, 40 steps)."""
    rows = []
    for name in ("float32", "bfloat16", "float16"):
        dtype = DTYPES[name]
        row = {"dtype": name, "tau_normal": tau(dtype, "normal"), "tau_subnormal": tau(dtype, "subnormal")}
        for kernel in target.kernels:
            try:
                sighted, blind = 0.0, 2 * tau(dtype, "subnormal")
                for _ in range(40):
                    middle = (sighted + blind) / 2
                    if two_key_weight(middle, dtype, kernel, target.device) == 0.0:
                        blind = middle
                    else:
                        sighted = middle
                row[kernel] = blind
            except RuntimeError as error:  # e.g. flash attention has no float32 kernel
                row[kernel] = f"unavailable: {str(error).splitlines()[0][:80]}"
        rows.append(row)
    return rows


def probe_memory(target: Target, args: argparse.Namespace) -> dict:
    """Peak memory of the probe on a random BLOOM-7B1-shaped model (bf16) at 2048 tokens; a tiny BLOOM in smoke."""
    from transformers import BloomConfig, BloomForCausalLM

    from blindheads.probes.published import measure

    if args.smoke:
        shape, length = {"vocab_size": 512, "hidden_size": 64, "n_layer": 2, "n_head": 4}, 128
    else:
        shape, length = {"vocab_size": 250880, "hidden_size": 4096, "n_layer": 30, "n_head": 32}, 2048
    config = BloomConfig(**shape, attn_implementation="eager")
    with torch.device(target.device):
        model = BloomForCausalLM(config).to(torch.bfloat16).eval()
    target.reset_peak()
    weights_gib = target.allocated_gib()
    start = time.perf_counter()
    layers = measure(model, torch.randint(0, config.vocab_size, (1, length), device=target.device))
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights_gib": weights_gib,
        "peak_gib": target.peak_gib(),
        "seconds": time.perf_counter() - start,
        "layers_measured": len(layers),
    }


PARTS = {"backends": backends_agree, "zero_thresholds": zero_thresholds, "training": training_steps,
         "probe_7b": probe_memory}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print(
            "gpu_check: no CUDA GPU here; nothing was measured (run it on a GPU machine, or --smoke)", file=sys.stderr
        )
        return 2
    target = Target(torch.device("cuda" if torch.cuda.is_available() else "cpu"), args.smoke)
    name = torch.cuda.get_device_name() if target.cuda else "cpu"
    report = {"device": name, "torch": torch.__version__, "smoke": args.smoke, "skipped": {}, "seconds": {}}
    plan = ", ".join(f"{part} ~{seconds} s" for part, seconds in EXPECTED_S.items())
    print(f"gpu_check on {name}: {plan} (expected on an H100/H200; total ~{sum(EXPECTED_S.values())} s)")
    started = time.perf_counter()
    for part, run in PARTS.items():
        left = None if args.budget_s is None else args.budget_s - (time.perf_counter() - started)
        if left is not None and EXPECTED_S[part] > left:
            report["skipped"][part] = f"expected {EXPECTED_S[part]} s, {left:.0f} s of the budget left"
            print(f"== {part}: skipped ({report['skipped'][part]})", flush=True)
            continue
        start = time.perf_counter()
        report[part] = run(target, args)
        report["seconds"][part] = round(time.perf_counter() - start, 1)
        print(f"== {part} ({report['seconds'][part]:.0f} s; {time.perf_counter() - started:.0f} s so far)", flush=True)
        rows = report[part] if isinstance(report[part], list) else [report[part]]
        for row in rows:
            print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        with open(args.out, "w") as file:  # after every part, so a time-out keeps what was measured
            json.dump(report, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
