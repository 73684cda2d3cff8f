"""The GPU paths in one run (at most about 5 minutes on one H100/H200): prints one table, writes JSON.

1. flex vs sdpa vs eager: outputs and gradients for every position component and the paper's combinations;
2. compiled flex + bf16 training steps of the 148M shape: tokens/s, MFU, peak memory, ALiBi / NoPE / RoPE ratios;
3. softmax zero thresholds on the GPU (fp32, bf16, fp16) under FlexAttention, SDPA's flash and memory-efficient
   kernels and the eager softmax, beside ``tau`` in both modes;
4. the probe's peak memory on a random 7B-shaped ALiBi model (BLOOM-7B1's shape) at 2048 tokens.

    python benchmarks/gpu_check.py [--out gpu_check.json] [--steps 10] [--batch 8]

Without a CUDA GPU it measures nothing and says so (exit status 2): nothing here is faked on a CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

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
KERNELS = ("flex", "flash", "efficient", "eager")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON goes")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per setup (after 3 warm-up)")
    parser.add_argument("--batch", type=int, default=8, help="windows of 2048 tokens per training step")
    parser.add_argument("--layers", type=int, default=30, help="layers of the 148M shape")
    return parser.parse_args(argv)


def backends_agree(device: torch.device) -> list[dict]:
    """Max abs difference of flex and sdpa against eager (float32, tiny model), outputs and gradients."""
    rows, tokens = [], torch.randint(0, 512, (2, 256), device=device)
    for spec in SPECS:
        results = {}
        for attention in ("eager", "sdpa", "flex"):
            torch.manual_seed(0)
            model = Decoder(
                DecoderConfig.from_preset(
                    "tiny", position=spec, attention=attention, context_length=512, dtype="float32"
                )
            ).to(device)
            logits = model(tokens)
            logits.pow(2).mean().backward()
            results[attention] = (logits.detach(), {n: p.grad for n, p in model.named_parameters()})
        row = {"spec": spec}
        for attention in ("sdpa", "flex"):
            out, grads = results[attention]
            row[f"{attention}_output"] = (out - results["eager"][0]).abs().max().item()
            row[f"{attention}_grad"] = max((g - results["eager"][1][n]).abs().max().item() for n, g in grads.items())
        rows.append(row)
    return rows


def training_steps(device: torch.device, args: argparse.Namespace) -> list[dict]:
    """Compiled flex + bf16 autocast steps of the 148M shape: forward, backward, fused AdamW."""
    from lightning.fabric.utilities.throughput import get_available_flops

    from blindheads.modules.lm import DecoderLM

    rows = []
    for spec in TRAINING:
        torch.manual_seed(0)
        config = DecoderConfig.from_preset("smollm-148m", position=spec, attention="flex", num_layers=args.layers)
        lm = DecoderLM(config, compile=True).to(device)
        optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-4, fused=True)
        windows = torch.randint(0, config.vocab_size, (args.batch, 2049), device=device)
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _step in range(3 + args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = lm.loss(windows)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        step_s = sorted(times[3:])[len(times[3:]) // 2]
        tokens = args.batch * 2048
        peak = get_available_flops(device, torch.bfloat16)
        mfu = lm.flops_per_token(2048) * tokens / step_s / peak if peak else float("nan")
        rows.append(
            {
                "spec": spec,
                "step_s": step_s,
                "tokens_per_s": tokens / step_s,
                "mfu": mfu,
                "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
                "compile_s": times[0],
            }
        )
        del lm, optimizer
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


def zero_thresholds(device: torch.device) -> list[dict]:
    rows = []
    for name in ("float32", "bfloat16", "float16"):
        dtype = DTYPES[name]
        row = {"dtype": name, "tau_normal": tau(dtype, "normal"), "tau_subnormal": tau(dtype, "subnormal")}
        for kernel in KERNELS:
            try:
                sighted, blind = 0.0, 2 * tau(dtype, "subnormal")
                for _ in range(40):
                    middle = (sighted + blind) / 2
                    if two_key_weight(middle, dtype, kernel, device) == 0.0:
                        blind = middle
                    else:
                        sighted = middle
                row[kernel] = blind
            except RuntimeError as error:  # e.g. flash attention has no float32 kernel
                row[kernel] = f"unavailable: {str(error).splitlines()[0][:80]}"
        rows.append(row)
    return rows


def probe_memory(device: torch.device) -> dict:
    """Peak GPU memory of the probe on a random BLOOM-7B1-shaped model (bf16) at 2048 tokens."""
    from transformers import BloomConfig, BloomForCausalLM

    from blindheads.probes.published import measure

    config = BloomConfig(vocab_size=250880, hidden_size=4096, n_layer=30, n_head=32, attn_implementation="eager")
    with torch.device(device):
        model = BloomForCausalLM(config).to(torch.bfloat16).eval()
    torch.cuda.reset_peak_memory_stats()
    weights_gib = torch.cuda.memory_allocated() / 2**30
    start = time.perf_counter()
    layers = measure(model, torch.randint(0, config.vocab_size, (1, 2048), device=device))
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights_gib": weights_gib,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "seconds": time.perf_counter() - start,
        "layers_measured": len(layers),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here; nothing was measured (run it on a GPU machine)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    parts = (
        ("backends", lambda: backends_agree(device)),
        ("zero_thresholds", lambda: zero_thresholds(device)),
        ("training", lambda: training_steps(device, args)),
        ("probe_7b", lambda: probe_memory(device)),
    )
    for name, part in parts:
        start = time.perf_counter()
        report[name] = part()
        print(f"== {name} ({time.perf_counter() - start:.0f} s)")
        rows = report[name] if isinstance(report[name], list) else [report[name]]
        for row in rows:
            print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        with open(args.out, "w") as file:  # after every part, so a time-out keeps what was measured
            json.dump(report, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
