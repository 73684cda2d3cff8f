"""blindheads conjecture: where does learning through a small attention weight stop, and is it at exact zero?

Exactly-zero weights pass no gradient, so a head blind from the start could never learn to use what lies beyond its
blind distance; the question is whether tiny non-zero weights do any better. Both arms give the only useful fact
(a digit 96-128 tokens back) a step bias of -B, B the dose, swept from 0 past the float32 flush edge (``tau``,
where the far weight is exactly 0) to a masked control:

- the bare head (``far_head``): one attention head, every B and seed trained at once; four optimizer arms: Adam
  (eps 1e-8), Adam with eps 1e-20 (Adam rescales tiny gradients: does that rescue them?), Adam in float64 (does the
  float format move the stopping point?) and SGD;
- the decoder (``far_decoder``): the project's decoder pretrained once per seed on near recall, then trained per B.

Each arm (the decoder: each seed) is one run of the experiment loop: its record goes to ``OUT/records/`` as it
finishes, so a part of the experiment can be committed and the same command continues with what is missing.
The summary: per arm and B, seeds that learned, steps to 0.9 held-out accuracy, the starting far weight and the
gradient reaching the digit; a figure, and a verdict computed from them (``conjecture_verdict``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from blindheads.arguments import Parser
from blindheads.experiments.conjecture import far_head
from blindheads.experiments.conjecture.runs import ARMS, BIASES, runs, train_arm, write_summary
from blindheads.experiments.driver.launchers import add_launcher_options
from blindheads.experiments.driver.loop import add_part_option, run_experiment
from blindheads.experiments.driver.options import at_least, checked, distinct
from blindheads.experiments.driver.records import write_json


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, every value checked before anything runs (one line naming the bad value and the choices)."""
    parser = Parser("blindheads conjecture", __doc__)
    parser.add_argument("--arms", nargs="+", default=ARMS, help=f"any of {', '.join(ARMS)}")
    parser.add_argument("--biases", nargs="+", default=BIASES,
                        help=f"step heights B in nats: numbers, {far_head.FLUSH_EDGE} (float32's flush edge), "
                             f"{far_head.MASKED}")  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="seeds of the bare-head arms")
    parser.add_argument("--decoder-seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds of the decoder arm")
    parser.add_argument("--steps", type=int, default=10_000, help="training steps of a bare-head arm")
    parser.add_argument("--decoder-pretrain", type=int, default=300, help="near-recall steps before the conditions")
    parser.add_argument("--decoder-steps", type=int, default=1000, help="most far-recall steps of a decoder condition")
    parser.add_argument("--decoder-every", type=int, default=5, help="steps between a decoder's measurements")
    parser.add_argument("--every", type=int, default=25, help="steps between held-out measurements")
    parser.add_argument("--runs", default="runs/conjecture", help="each run's log and record")
    parser.add_argument("--out", help="summary directory; default: the runs' directory + -summary")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once, one thread each")
    add_part_option(parser)
    add_launcher_options(parser)
    args = parser.parse_args(argv)
    args.config, args.extra = [], []
    unknown = [arm for arm in args.arms if arm not in ARMS]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; valid: {', '.join(ARMS)}")
    for bias in args.biases:
        far_head.bias_value(bias)
    distinct("--arms", args.arms)
    distinct("--biases", args.biases)
    distinct("--decoder-seeds", args.decoder_seeds)
    at_least("--decoder-seeds", args.decoder_seeds, 0)
    at_least("--steps, --decoder-pretrain, --decoder-steps, --every and --decoder-every",
             [args.steps, args.decoder_pretrain, args.decoder_steps, args.every, args.decoder_every], 1)  # fmt: skip
    return checked(args)


def arm_main(argv: list[str]) -> None:
    """``blindheads conjecture-arm``: one run of the experiment (the driver starts it), its rows in
    ``--out/results.json``."""
    parser = Parser("blindheads conjecture-arm", arm_main.__doc__)
    parser.add_argument("--arm", required=True, choices=ARMS)
    parser.add_argument("--biases", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--pretrain", type=int, default=0)
    parser.add_argument("--every", type=int, required=True)
    parser.add_argument("--out", required=True, help="the run's directory")
    args = parser.parse_args(argv)
    result = train_arm(args.arm, args.biases, args.seeds, args.steps, args.pretrain, args.every)
    write_json(Path(args.out) / "results.json", result, compact=True)


def main(argv: list[str]) -> pd.DataFrame | None:
    args = parse_args(argv)

    def write(out: Path, records: list[dict], command: str, wall_s: float, remaining: list[str]) -> pd.DataFrame:
        return write_summary(out, records, command, wall_s, remaining, sorted({*args.seeds, *args.decoder_seeds}))

    return run_experiment("conjecture", argv, args, runs(args), write)
