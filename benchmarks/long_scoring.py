"""Scoring one long sequence with the 148M decoder on CPU: seconds and peak memory (SDPA in causal query blocks).

python benchmarks/long_scoring.py [--length 16384] [--layers 30]
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from blindheads.evaluation.scoring import token_losses
from blindheads.modules import Decoder, DecoderConfig
from blindheads.numerics import apply_threshold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    apply_threshold("normal")  # as `blindheads fit/test` run on the CPU
    torch.manual_seed(0)
    decoder = Decoder(
        DecoderConfig.from_preset("smollm-148m", attention="sdpa", num_layers=args.layers, dtype="float32")
    ).eval()
    tokens = torch.randint(0, decoder.config.vocab_size, (1, args.length + 1))
    start = time.perf_counter()
    with torch.no_grad():
        losses = token_losses(decoder, tokens)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"smollm-148m ({args.layers} layers), {args.length} tokens: {seconds:.1f} s, peak RSS {peak:.2f} GiB, "
        f"mean loss {losses.mean():.3f}, {torch.get_num_threads()} threads"
    )


if __name__ == "__main__":
    main()
