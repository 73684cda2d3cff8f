"""Attention alone, forward+backward, as the CPU backends run it: NoPE with ``is_causal``, ALiBi as one
whole-square mask (the old path) and in causal query blocks, soft caps over the whole square (eager) and in blocks.

    python benchmarks/attention_blocks.py [--length 1024] [--rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from blindheads.modules import backends
from blindheads.modules.position import build_position
from blindheads.numerics import apply_threshold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds; the first warms up")
    args = parser.parse_args()
    apply_threshold("normal")  # as `blindheads fit` runs on the CPU
    torch.manual_seed(0)
    length, device, weights = args.length, torch.device("cpu"), backends.AttentionWeights(torch.float32)
    q, k, v = (torch.randn(2, 9, length, 64, requires_grad=True) for _ in range(3))

    def run(kind, spec):
        stack, backend = build_position(spec, 9, 2048, "float32"), kind()
        backend.prepare(stack, length, device, torch.float32)
        return lambda: backend.attend(q, k, v, stack, weights)

    whole = build_position("alibi", 9, 2048, "float32").dense_bias(length, length, device)
    cases = {
        "nope, is_causal": run(backends.Sdpa, "nope"),
        "alibi, whole-square mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=whole),
        f"alibi, blocks of {backends.SDPA_QUERY_BLOCK}": run(backends.Sdpa, "alibi"),
        "alibi+soft_cap, whole square (eager)": run(backends.Eager, "alibi+soft_cap"),
        f"alibi+soft_cap, blocks of {backends.SDPA_QUERY_BLOCK}": run(backends.BlockedEager, "alibi+soft_cap"),
    }
    times = {name: [] for name in cases}
    for round_ in range(args.rounds):
        for name, attend in cases.items():
            start = time.perf_counter()
            attend().sum().backward()
            if round_:
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["nope, is_causal"])
    print(f"2 x 9 heads x {length} x 64, forward+backward, median of {args.rounds - 1} rounds")
    for name, values in times.items():
        print(f"{name:<40} {statistics.median(values):.4f} s  x{statistics.median(values) / base:.2f}")


if __name__ == "__main__":
    main()
