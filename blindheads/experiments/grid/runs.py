"""The grid's runs: every position setup of an experiment config at several seeds, each a ``blindheads fit`` then
``blindheads test`` in ``RUNS/SETUP/seedS`` (the command: ``blindheads.cli.grid``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from blindheads.experiments.driver.loop import Run
from blindheads.experiments.driver.options import configs
from blindheads.experiments.grid.curves import measured_during_training
from blindheads.experiments.grid.setups import position_of, setup_files

# The paper's 13 setups (configs/position/; laptop.yaml's overlay makes the sliding window 128 tokens)
PAPER_SETUPS = [
    "nope", "rope", "alibi", "steep", "safe", "wide", "robust", "clamp", "log_distance", "soft_cap",
    "sliding_window", "clamp_log_distance", "wide_clamp_log_distance",
]  # fmt: skip


def run_options(setup: str, seed: int, args: argparse.Namespace) -> list[str]:
    """Every option of the run's ``fit`` and ``test``: what decides its result, and where it is written."""
    return [
        *configs(setup_files(setup, args.config)), "--seed_everything", str(seed),
        "--trainer.logger.init_args.save_dir", args.runs, "--trainer.logger.init_args.name", setup,
        "--trainer.logger.init_args.version", f"seed{seed}", *args.extra,
    ]  # fmt: skip


def runs(args: argparse.Namespace) -> list[Run]:
    """A fit then a test of every setup at every seed, seed by seed (a part cut short by ``--hours`` leaves whole
    seeds to compare setups on)."""
    return [
        Run(f"{setup} seed {seed}", Path(args.runs) / setup / f"seed{seed}",
            {"setup": setup, "seed": seed, "position": position_of(setup_files(setup, args.config))},
            run_options(setup, seed, args), setup_files(setup, args.config), ("fit", "test"),
            measured_during_training)
        for seed in args.seeds for setup in args.setups
    ]  # fmt: skip
