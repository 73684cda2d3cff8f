"""blindheads grid: train every position setup of an experiment config at several seeds, test each, and write one
summary (CSV, Markdown, figures, results.json).

Each run is a blindheads fit then blindheads test subprocess in RUNS/SETUP/seedS (checkpoints and
TensorBoard logs, kept out of the summary folder); --parallel runs share the machine (one thread each). A killed
grid continues where it stopped: a run with done.json is done, one with last.ckpt resumes from it. A run
directory made with other options (configs, seed, options after --) is refused, naming the difference, and so is a
summary folder made by another grid (or holding results without a record of their options). A done.json edited
after its run (its digest done.sha256, the results.json its test wrote) is restored from the summary's record where
that matches, else refused. Ctrl-C or SIGTERM stops every run at its next step with last.ckpt saved; the same
command continues.

With --launcher local|slurm each run is a job of one submitit job array instead (docs/cluster.md): the command
returns once they are queued (--wait: once the summary is written), and the same command later reports, collects and
resubmits. A machine without SLURM, or a submission sbatch refuses, is one line and leaves nothing behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from blindheads.arguments import Parser
from blindheads.experiments.driver.launchers import add_launcher_options
from blindheads.experiments.driver.loop import add_part_option, run_experiment
from blindheads.experiments.driver.options import checked, distinct
from blindheads.experiments.grid.runs import PAPER_SETUPS, runs
from blindheads.experiments.grid.setups import setup_names
from blindheads.experiments.grid.summary import write_summary


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, every value checked before anything runs (one line naming the bad value and the choices)."""
    parser = Parser("blindheads grid", __doc__)
    parser.add_argument(
        "--config",
        nargs="+",
        default=["configs/experiments/laptop.yaml"],
        help="the experiment config; later files override earlier ones (e.g. laptop.yaml dense_recall.yaml)",
    )
    parser.add_argument(
        "--setups", nargs="+", default=PAPER_SETUPS, help=f"any of {', '.join(setup_names())} (configs/position/)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--runs", default="runs/laptop-grid", help="the runs' directory (checkpoints, logs)")
    parser.add_argument(
        "--out", help="summary directory (tables, figures, results.json); default: the runs' directory + -summary"
    )
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each)")
    add_part_option(parser)
    add_launcher_options(parser)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: options for every fit and test")
    args = parser.parse_args(argv)
    unknown = [s for s in args.setups if s not in setup_names()]
    if unknown:
        raise ValueError(f"unknown setups {unknown}; valid: {', '.join(setup_names())}")
    distinct("--setups", args.setups)
    return checked(args)


def main(argv: list[str]) -> list[dict] | None:
    args = parse_args(argv)

    def write(out: Path, records: list[dict], command: str, wall_s: float, remaining: list[str]) -> list[dict]:
        write_summary(out, records, command=command, wall_s=wall_s, runs_dir=Path(args.runs), remaining=remaining)
        return records

    return run_experiment("grid", argv, args, runs(args), write)
