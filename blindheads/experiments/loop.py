"""The loop every experiment (``grid``, ``conjecture``) runs: claim its run directories, run each not yet done
(``--parallel`` at once, a killed one resumed from its ``last.ckpt``), record it done, then publish one summary.
An experiment supplies only its runs (``Run``) and what its summary writes from their records.

A run is done when its record is kept: in the summary folder (``OUT/records/RUN.json``, written the moment the run
finishes, beside the options that made it), or in its run directory (``done.json``; a grid run made before this
loop, by the ``results.json`` its test wrote). The summary folder is what gets committed, so an experiment can be
done in parts: ``--hours`` starts no run after that long, the summary covers the runs done so far and names the
rest, and the same command on any checkout of those records runs only what is missing. A kept record made with
other options is refused, naming the difference.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from blindheads.experiments.runner import (
    RECORDS,
    Driver,
    RunChanged,
    difference,
    experiment,
    identity,
    publish,
    read_json,
    resume_option,
    write_json,
)

DONE = "done.json"  # a run's record, written once its last command succeeded
TESTED = "results.json"  # what ``blindheads test`` (or any command of a run) writes in the run directory
LIGHTNING = ("fit", "test")  # commands that take a checkpoint: fit resumes from one, test reads the fit's
T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    """One run of an experiment: its name in what the driver prints, its directory, the ``blindheads`` commands
    that make it, each given ``options`` (``fit`` adds ``--ckpt_path last`` where a killed run left a checkpoint;
    ``test`` reads the fit's ``last.ckpt``; any other command starts over), and the config files they read. ``options`` and ``files`` decide
    its result (its identity); ``labels`` (setup or condition, seed) start its record, and ``measured`` adds what
    the finished run's directory holds beyond its test's results (the grid: its curves over training)."""

    name: str
    directory: Path
    labels: dict
    options: list[str]
    files: list[str]
    commands: tuple[str, ...] = ("fit",)
    measured: Callable[[Path], dict] | None = None


def add_part_option(parser: argparse.ArgumentParser) -> None:
    """``--hours``: the experiment in parts (a laptop's evening, a cluster's time limit)."""
    parser.add_argument("--hours", type=float, help="start no run after this many hours; the summary covers what is "
                        "done and names the rest, and the same command continues (default: no limit)")  # fmt: skip


def run_experiment(program: str, argv: list[str], args: argparse.Namespace, runs: list[Run],
                   summarize: Callable[[Path, list[dict], str, float, list[str]], T]) -> T:  # fmt: skip
    """Every run done (or, past ``args.hours``, those done so far), then ``summarize(folder, records, command,
    wall_s, remaining)`` published whole to ``args.out``, ``remaining`` naming the runs not done (for its
    ``results.json``; ``summary.md`` gets a line naming them); what it returns."""
    started = time.monotonic()
    hours = getattr(args, "hours", None)  # checked (``runner.checked``)
    deadline = started + hours * 3600 if hours else None
    wanted = {run.directory: identity(run.options, run.files) for run in runs}
    out = Path(args.out)
    with experiment(program, args, wanted, [file for run in runs for file in run.files]) as driver:
        with ThreadPoolExecutor(args.parallel) as pool:
            done = list(pool.map(lambda run: complete(run, driver, out, wanted[run.directory], deadline), runs))
            records = [record for record in done if record is not None]
        remaining = [run.name for run, record in zip(runs, done, strict=True) if record is None]
        if remaining:
            print(f"blindheads {program}: {len(records)} of {len(runs)} runs done after --hours {hours}; the same "
                  "command continues", flush=True)  # fmt: skip
        command, wall_s = f"blindheads {program} " + " ".join(argv), time.monotonic() - started

        def write(staging: Path) -> T:
            written = summarize(staging, records, command, wall_s, remaining)
            if remaining:
                with (staging / "summary.md").open("a") as summary:
                    summary.write(f"\n{len(records)} of {len(runs)} runs done; the same command runs the rest: "
                                  f"{', '.join(remaining)}.\n")  # fmt: skip
            return written

        written = publish(out, write)
    print(f"summary: {out / 'summary.md'}")
    return written


def record_path(out: Path, run: Run) -> Path:
    """Where the summary folder keeps ``run``'s record: named after the run (``alibi seed 0`` -> ``alibi-seed-0``)."""
    return out / RECORDS / f"{run.name.replace(' ', '-')}.json"


def complete(run: Run, driver: Driver, out: Path, wanted: dict, deadline: float | None = None) -> dict | None:
    """The run's record: read where it is kept, else made by running its commands (with its wall time, and
    ``resumed`` where it continued a killed run: the wall time counts only the part after the resume) and kept in
    the summary folder at once; None where ``deadline`` passed before it could start."""
    done = kept_record(record_path(out, run), wanted) or done_record(run.directory)
    if done is not None:
        return {**run.labels, **done}
    if deadline is not None and time.monotonic() > deadline:
        return None
    resume = resume_option(run.directory)
    started = time.monotonic()
    for command in run.commands:
        checkpoint = {"fit": resume, "test": ["--ckpt_path", "last"]}.get(command, [])
        driver.launch([command, *run.options, *checkpoint], run.directory)
    tested = run.directory / TESTED
    record = {**run.labels, **(read_json(tested) if tested.exists() else {})}
    if run.measured is not None:
        record.update(run.measured(run.directory))
    record["wall_s"] = round(time.monotonic() - started, 1)
    if resume:
        record["resumed"] = True
    write_json(run.directory / DONE, record)
    write_json(record_path(out, run), {"options": wanted, "record": record}, compact=True)
    print(f"{run.name}: done in {record['wall_s']:.0f} s", flush=True)
    return record


def kept_record(path: Path, wanted: dict) -> dict | None:
    """The record the summary folder keeps at ``path``, if any; refused if made with other options."""
    if not path.exists():
        return None
    kept = read_json(path)
    if kept["options"] != wanted:
        raise RunChanged(f"{path} was made with other options ({difference(kept['options'], wanted)}); remove it to "
                         "run it again with these, or pass another --out")  # fmt: skip
    return kept["record"]


def done_record(run_dir: Path) -> dict | None:
    """The record of a done run (``done.json``, or the ``results.json`` of a grid run made before it), else None."""
    for name in (DONE, TESTED):
        if (run_dir / name).exists():
            return read_json(run_dir / name)
    return None
