"""The loop every experiment (``grid``, ``conjecture``) runs: claim its run directories, run each not yet done
(``--parallel`` at once, a killed one resumed from its ``last.ckpt``), record it done, then publish one summary.
An experiment supplies only its runs (``Run``) and what its summary writes from their records.

A run is done when its ``done.json`` (``DONE``) holds its record, written after its last command succeeded. Runs
made before this loop are recognised too: the conjecture's used the same marker; the grid's marked a run done by
the ``results.json`` its test writes, so a run with that file (and no ``done.json``) counts as done, its record read
from it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from blindheads.experiments.runner import Driver, experiment, identity, publish, read_json, resume_option, write_json

DONE = "done.json"  # a run's record, written once its last command succeeded
TESTED = "results.json"  # what ``blindheads test`` writes in the run directory
T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    """One run of an experiment: its name in what the driver prints, its directory, the ``blindheads`` commands
    that make it, each given ``options`` (``fit`` adds ``--ckpt_path last`` where a killed run left a checkpoint; a
    later command reads the fit's ``last.ckpt``), and the config files they read. ``options`` and ``files`` decide
    its result (its identity); ``labels`` (setup or condition, seed) start its record."""

    name: str
    directory: Path
    labels: dict
    options: list[str]
    files: list[str]
    commands: tuple[str, ...] = ("fit",)


def run_experiment(program: str, argv: list[str], args: argparse.Namespace, runs: list[Run],
                   summarize: Callable[[Path, list[dict], str, float], T]) -> T:  # fmt: skip
    """Every run done, then ``summarize(folder, records, command, wall_s)`` published whole to ``args.out``; what
    it returns."""
    started = time.monotonic()
    wanted = {run.directory: identity(run.options, run.files) for run in runs}
    with experiment(program, args, wanted, [file for run in runs for file in run.files]) as driver:
        with ThreadPoolExecutor(args.parallel) as pool:
            records = list(pool.map(lambda run: complete(run, driver), runs))
        command, wall_s = f"blindheads {program} " + " ".join(argv), time.monotonic() - started
        written = publish(Path(args.out), lambda staging: summarize(staging, records, command, wall_s))
    print(f"summary: {Path(args.out) / 'summary.md'}")
    return written


def complete(run: Run, driver: Driver) -> dict:
    """The run's record: read where it is done, else made by running its commands (with its wall time, and
    ``resumed`` where it continued a killed run: the wall time counts only the part after the resume)."""
    done = done_record(run.directory)
    if done is not None:
        return {**run.labels, **done}
    resume = resume_option(run.directory)
    started = time.monotonic()
    for command in run.commands:
        checkpoint = resume if command == "fit" else ["--ckpt_path", "last"]
        driver.launch([command, *run.options, *checkpoint], run.directory)
    tested = run.directory / TESTED
    record = {**run.labels, **(read_json(tested) if tested.exists() else {})}
    record["wall_s"] = round(time.monotonic() - started, 1)
    if resume:
        record["resumed"] = True
    write_json(run.directory / DONE, record)
    print(f"{run.name}: done in {record['wall_s']:.0f} s", flush=True)
    return record


def done_record(run_dir: Path) -> dict | None:
    """The record of a done run (``done.json``, or the ``results.json`` of a grid run made before it), else None."""
    for name in (DONE, TESTED):
        if (run_dir / name).exists():
            return read_json(run_dir / name)
    return None
