"""blindheads probe: measured attention underflow of a published model beside the calculator's prediction."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from blindheads.arguments import Parser
from blindheads.numerics import DTYPES, LEARNING_HORIZON
from blindheads.probes.outputs import head_table, write_outputs
from blindheads.probes.published import probe


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser("blindheads probe", __doc__)
    parser.add_argument("--model", required=True, help="Hub name or local directory of a causal LM")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--text", nargs="+", default=["builtin"], help="'builtin' or parquet/jsonl/txt files")
    parser.add_argument("--samples", type=int, default=1, help="sequences per length")
    parser.add_argument("--out", help="output directory (default: probes/<model name>)")
    parser.add_argument("--retrieval", action="store_true", help="also run passkey and needle with its tokenizer")
    args = parser.parse_args(argv)
    if any(n < 2 for n in args.lengths) or args.samples < 1:
        parser.error(f"lengths must be >= 2 and samples >= 1, got {args.lengths} and {args.samples}")
    return args


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    summary, results, predicted = probe(args.model, args.dtype, args.text, args.lengths, args.samples, args.retrieval)
    out = Path(args.out or Path("probes") / Path(args.model).name)
    write_outputs(out, summary, results, predicted)
    print(f"probe of {args.model}: {len(results[0].layers)} layers, lengths {sorted(args.lengths)}; results in {out}/")
    for r in results:
        shares = torch.stack([s.zero_share for s in r.layers])
        deaf = torch.stack([s.deaf_share for s in r.layers])
        print(
            f"  {r.length:>6} tokens: {shares.mean():.2%} of causal weights exactly zero (max head {shares.max():.2%}),"
            f" {deaf.mean():.2%} past the learning horizon, below e^-{LEARNING_HORIZON:g} of their row's largest"
            f" (max head {deaf.max():.2%})"
        )
    print("\n".join(head_table(results[-1], predicted)))
    return summary
