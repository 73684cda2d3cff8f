"""blindheads grid: train every position setup of an experiment config at several seeds, test each, and write one
summary (CSV, Markdown, figures, results.json).

Each run is a blindheads fit then blindheads test subprocess in RUNS/SETUP/seedS (checkpoints and
TensorBoard logs, kept out of the summary folder); --parallel runs share the machine (one thread each). A killed
grid continues where it stopped: a run with results.json is done, one with last.ckpt resumes from it. A run
directory made with other options (configs, seed, options after --) is refused, naming the difference.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from blindheads.arguments import Parser
from blindheads.experiments.runner import claim_all, configs, identity, launch, read_json, resume_option, write_json
from blindheads.experiments.setups import position_of, setup_files, setup_names
from blindheads.experiments.summary import write_summary

# The paper's 13 setups (configs/position/; laptop.yaml's overlay makes the sliding window 128 tokens)
PAPER_SETUPS = [
    "nope", "rope", "alibi", "steep", "safe", "wide", "robust", "clamp", "log_distance", "soft_cap",
    "sliding_window", "clamp_log_distance", "wide_clamp_log_distance",
]  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
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
    parser.add_argument("--out", default="results/laptop", help="summary directory (tables, figures, results.json)")
    parser.add_argument("--runs", default="runs/laptop-grid", help="the runs' directory (checkpoints, logs)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each)")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: options for every fit and test")
    args = parser.parse_args(argv)
    unknown = [s for s in args.setups if s not in setup_names()]
    if unknown:
        parser.error(f"unknown setups {unknown}; valid: {', '.join(setup_names())}")
    if args.parallel < 1 or not args.seeds:
        parser.error(f"--parallel must be >= 1 and --seeds non-empty, got {args.parallel} and {args.seeds}")
    args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    return args


def run_options(setup: str, seed: int, args: argparse.Namespace) -> list[str]:
    """Every option of the run's ``fit`` and ``test``: what decides its result, and where it is written."""
    return [
        *configs(setup_files(setup, args.config)), "--seed_everything", str(seed),
        "--trainer.logger.init_args.save_dir", args.runs, "--trainer.logger.init_args.name", setup,
        "--trainer.logger.init_args.version", f"seed{seed}", *args.extra,
    ]  # fmt: skip


def run_one(setup: str, seed: int, args: argparse.Namespace) -> dict:
    """Fit (resuming a killed run) and test one setup at one seed; the run's results with its wall time."""
    run_dir = Path(args.runs) / setup / f"seed{seed}"
    results = run_dir / "results.json"
    common, position = run_options(setup, seed, args), position_of(setup_files(setup, args.config))
    if results.exists():  # done (by a grid that may have been killed before recording the run's identity)
        return {"setup": setup, "seed": seed, "position": position, **read_json(results)}
    resume = resume_option(run_dir)
    started = time.monotonic()
    for command in (["fit", *common, *resume], ["test", *common, "--ckpt_path", "last"]):
        launch(command, run_dir.parent / f"seed{seed}.{command[0]}.log", args.parallel)
    record = read_json(results)
    record.update(setup=setup, seed=seed, position=position, wall_s=round(time.monotonic() - started, 1))
    if resume:
        record["resumed"] = True  # its wall time counts only the part after the resume
    write_json(results, record)
    print(f"{setup} seed {seed}: done in {record['wall_s']:.0f} s", flush=True)
    return record


def main(argv: list[str]) -> list[dict]:
    args = parse_args(argv)
    started = time.monotonic()
    jobs = [(setup, seed) for setup in args.setups for seed in args.seeds]
    runs = Path(args.runs)
    claim_all({runs / s / f"seed{n}": identity(run_options(s, n, args), setup_files(s, args.config)) for s, n in jobs},
              "grid")  # fmt: skip
    with ThreadPoolExecutor(args.parallel) as pool:
        records = list(pool.map(lambda job: run_one(*job, args), jobs))
    command = "blindheads grid " + " ".join(argv)
    write_summary(Path(args.out), records, command=command, wall_s=time.monotonic() - started, runs_dir=Path(args.runs))
    print(f"summary: {Path(args.out) / 'summary.md'}")
    return records
