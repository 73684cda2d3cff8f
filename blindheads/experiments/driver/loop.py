"""The loop every experiment (``grid``, ``conjecture``) runs: claim its run directories, run each not yet done
(``--parallel`` at once, a killed one resumed from its ``last.ckpt``), record it done, then publish one summary.
An experiment supplies only its runs (``Run``) and what its summary writes from their records.

A run is done when its record is kept: in the summary folder (``OUT/records/RUN.json``, written the moment the run
finishes, beside the options that made it), or in its run directory (``done.json``, with its digest beside it in
``done.sha256``; a grid run made before this loop, by the ``results.json`` its test wrote). The summary folder is
what gets committed, so an experiment can be done in parts: ``--hours`` starts no run after that long, the summary
covers the runs done so far and names the rest, and the same command on any checkout of those records runs only what
is missing. A kept record made with other options is refused, naming the difference; one that differs from what its
run wrote is rebuilt from the run or refused; a ``done.json`` that differs from what its run wrote (its digest, the
``results.json`` its test wrote) is restored from the kept record where that matches, else refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

from blindheads import atomic
from blindheads.experiments.driver.folders import RECORDS, publish, resume_option
from blindheads.experiments.driver.identity import RunChanged, difference, identity
from blindheads.experiments.driver.jobs import Driver, experiment
from blindheads.experiments.driver.launchers import sweep
from blindheads.experiments.driver.records import read_json, write_json

DONE = "done.json"  # a run's record, written once its last command succeeded
SEALED = "done.sha256"  # the digest of that record, written beside it: an edit of done.json alone is seen
TESTED = "results.json"  # what ``blindheads test`` (or any command of a run) writes in the run directory
LIGHTNING = ("fit", "test")  # commands that take a checkpoint: fit resumes from one, test reads the fit's
T = TypeVar("T")


class Altered(RunChanged):
    """A run directory's ``done.json`` is not the record its run wrote (edited by hand, or removed)."""


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
                   summarize: Callable[[Path, list[dict], str, float, list[str]], T]) -> T | None:  # fmt: skip
    """Every run done (or, past ``args.hours``, those done so far), then ``summarize(folder, records, command,
    wall_s, remaining)`` published whole to ``args.out``, ``remaining`` naming the runs not done (for its
    ``results.json``; ``summary.md`` gets a line naming them); what it returns. With ``--launcher`` the runs are
    jobs of a job array instead (``launchers.sweep``), and the summary is written once every run is done or given
    up (None before)."""
    started = time.monotonic()
    hours = getattr(args, "hours", None)  # checked (``options.checked``)
    deadline = started + hours * 3600 if hours else None
    wanted = {run.directory: identity(run.options, run.files) for run in runs}
    out = Path(args.out)

    def summary(records: list[dict], remaining: list[str]) -> T:
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

    if getattr(args, "launcher", None):
        return sweep(program, args, runs, wanted, summary)
    with experiment(program, args, wanted, [file for run in runs for file in run.files]) as driver:
        with ThreadPoolExecutor(args.parallel) as pool:
            done = list(pool.map(lambda run: complete(run, driver, out, wanted[run.directory], deadline), runs))
            records = [record for record in done if record is not None]
        remaining = [run.name for run, record in zip(runs, done, strict=True) if record is None]
        if remaining:
            print(f"blindheads {program}: {len(records)} of {len(runs)} runs done after --hours {hours}; the same "
                  "command continues", flush=True)  # fmt: skip
        return summary(records, remaining)


def record_path(out: Path, run: Run) -> Path:
    """Where the summary folder keeps ``run``'s record: named after the run (``alibi seed 0`` -> ``alibi-seed-0``)."""
    return out / RECORDS / f"{run.name.replace(' ', '-')}.json"


def complete(run: Run, driver: Driver, out: Path, wanted: dict, deadline: float | None = None) -> dict | None:
    """The run's record: read where it is kept (``kept_record``), else from its run directory when it is done there
    (``done_record``; then kept in the summary folder too), else made by running its commands (``run_commands``) and
    kept in the summary folder at once; None where ``deadline`` passed before it could start."""
    record = finished(run, out, wanted)
    if record is not None:
        return record
    if deadline is not None and time.monotonic() > deadline:
        return None
    record = run_commands(run, driver)
    keep(record_path(out, run), run, wanted, record)
    print(f"{run.name}: done in {record['wall_s']:.0f} s", flush=True)
    return record


def finished(run: Run, out: Path, wanted: dict) -> dict | None:
    """The record of a run that is done: kept in the summary folder (``kept_record``), or done in its run directory
    (``done_record``; then kept in the summary folder too); else None. A run whose ``done.json`` differs from what it
    wrote (``Altered``) is done only where its kept record matches what it wrote, and ``done.json`` is restored."""
    path = record_path(out, run)
    try:
        ran, altered = done_record(run.directory), None
    except Altered as error:
        ran, altered = None, error
    kept = kept_record(path, wanted, run, ran, altered)
    if kept is not None:
        return {**run.labels, **kept}
    if ran is not None:
        keep(path, run, wanted, {**run.labels, **ran})
        return {**run.labels, **ran}
    return None


def run_commands(run: Run, driver: Driver) -> dict:
    """Run ``run``'s commands (``fit`` resumed from ``last.ckpt`` where a killed run left one) and write its record
    to ``done.json``: its labels, what its test wrote, what ``measured`` adds, its wall time, and ``resumed`` where
    it continued a killed run (the wall time counts only the part after the resume)."""
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
    write_done(run.directory, record)
    return record


def write_done(run_dir: Path, record: dict) -> None:
    """``done.json``, then its digest beside it (``done.sha256``): a run killed between the two is one finished
    before digests were written, checked against its ``results.json`` alone."""
    write_json(run_dir / DONE, record)
    atomic.write_text(run_dir / SEALED, digest(record) + "\n")


def digest(record: dict) -> str:
    """The SHA-256 of a record's canonical JSON (keys sorted, no spaces): what ties a kept record to its run's."""
    canonical = json.dumps(json.loads(json.dumps(record)), sort_keys=True, separators=(",", ":"))  # as read back
    return hashlib.sha256(canonical.encode()).hexdigest()


def keep(path: Path, run: Run, wanted: dict, record: dict) -> None:
    """Keep ``record`` in the summary folder: with the options that made it, the run it copies, its digest and the
    fit's ``max_steps`` (where the run has a fit) that its step must reach."""
    kept = {"options": wanted, "run": run.name, "digest": digest(record), "max_steps": fit_steps(run.directory)}
    write_json(path, {**kept, "record": record}, compact=True)


def kept_record(path: Path, wanted: dict, run: Run, ran: dict | None = None,
                altered: Altered | None = None) -> dict | None:  # fmt: skip
    """The record the summary folder keeps at ``path``, if it is one to trust: made with these options (else refused,
    naming the difference), naming ``run``, its record matching its digest and, where the run directory holds a
    finished run (``ran``, its record), that run's record, of a fit that reached its ``max_steps``. One that fails
    is rebuilt from the run directory where it holds the finished run (``None`` is returned, and a line says so),
    and refused otherwise; so is one without a digest. Where the run's ``done.json`` was ``altered``, the kept record must match what the
    run wrote (``wrote``): then ``done.json`` is restored from it, with a line; else both are refused."""
    if not path.exists():
        if altered is not None:
            raise RunChanged(f"{altered}, and {path} does not exist to restore it from: restore it, or remove "
                             f"{run.directory} to run {run.name} again")  # fmt: skip
        return None
    problem: str | None
    try:
        kept = read_json(path)
    except ValueError:  # cut short, or edited into something else
        kept, problem = None, "is not valid JSON"
    else:
        problem = _malformed(kept)
    if problem is None and kept["options"] != wanted:
        raise RunChanged(f"{path} was made with other options ({difference(kept['options'], wanted)}); remove it to "
                         "run it again with these, or pass another --out")  # fmt: skip
    if problem is None and "digest" not in kept and ran is None and altered is None:
        raise RunChanged(f"{path} has no digest, and {run.directory} holds no finished run to check it against: "
                         f"remove it to run {run.name} again")  # fmt: skip
    if problem is None:
        problem = _untrusted(kept, run, ran)
    if problem is None and altered is not None:
        problem = wrote(run.directory, kept["record"])
        if problem is None:
            write_done(run.directory, kept["record"])
            print(f"{altered}: restored from {path}, which matches what the run wrote", flush=True)
    if problem is None:
        return kept["record"]
    if ran is not None:
        print(f"{path} {problem}: rebuilt from the finished run in {run.directory}", flush=True)
        return None
    if altered is not None:
        raise RunChanged(f"{altered}, and {path} {problem}: restore the file edited, or remove {run.directory} to "
                         f"run {run.name} again")  # fmt: skip
    raise RunChanged(f"{path} {problem}, and {run.directory} holds no finished run to rebuild it from: remove it to "
                     f"run {run.name} again")  # fmt: skip


def _malformed(kept) -> str | None:
    """What makes ``kept`` no kept record (a JSON object of options, run, digest and record), else None."""
    if (
        not isinstance(kept, dict)
        or not isinstance(kept.get("options"), dict)
        or not isinstance(kept.get("record"), dict)
    ):
        return "is not a kept record (a JSON object with options, run, digest and record)"
    if not all(
        isinstance(kept["options"].get(key), kind)
        for key, kind in (("options", list), ("env", dict), ("configs", dict))
    ):
        return "is not a kept record (its options are not those of a run)"
    return None


def _untrusted(kept: dict, run: Run, ran: dict | None) -> str | None:
    """Why a well-formed kept record cannot be taken for ``run`` (whose finished record is ``ran``), else None."""
    if "digest" in kept and kept.get("run") != run.name:
        return f"names the run {kept.get('run')!r}, not {run.name!r}"
    if kept.get("digest") != digest(kept["record"]):
        return "does not match its digest (edited by hand?)" if "digest" in kept else "has no digest"
    if ran is not None and kept["digest"] != digest({**run.labels, **ran}):
        return "does not match the record of its run"
    return unfinished(kept["record"], kept.get("max_steps"))


def unfinished(record: dict, max_steps) -> str | None:
    """Why ``record`` is of a fit that stopped before its ``max_steps`` (its ``global_step`` lower), else None."""
    step = record.get("global_step")
    if isinstance(step, int) and isinstance(max_steps, int) and step < max_steps:
        return f"is of step {step}, before the fit's max_steps {max_steps} (an interrupted run tested by hand?)"
    return None


def fit_steps(run_dir: Path) -> int | None:
    """The ``trainer.max_steps`` of the fit that made ``run_dir`` (its ``config.yaml``), None where it has none."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    trainer = config.get("trainer") if isinstance(config, dict) else None
    steps = trainer.get("max_steps") if isinstance(trainer, dict) else None
    return steps if isinstance(steps, int) and steps >= 0 else None


def done_record(run_dir: Path) -> dict | None:
    """The record of a done run (``done.json``, or the ``results.json`` of a grid run made before it), else None:
    a record of a step before the fit's ``max_steps`` (an interrupted run tested by hand) is no finished run, and a
    line says so (the run resumes); so is a record that is no JSON object. A ``done.json`` that differs from what
    its run wrote (``wrote``), or one removed from beside its digest, is refused (``Altered``)."""
    if (run_dir / SEALED).exists() and not (run_dir / DONE).exists():
        raise Altered(f"{run_dir / DONE} is missing beside its digest in {run_dir / SEALED} (removed?)")
    for name in (DONE, TESTED):
        if (run_dir / name).exists():
            record = read_json(run_dir / name)
            if name == DONE and isinstance(record, dict) and (why := wrote(run_dir, record)) is not None:
                raise Altered(f"{run_dir / DONE} {why}")
            why = unfinished(record, fit_steps(run_dir)) if isinstance(record, dict) else "is not a JSON object"
            if why is None:
                return record
            print(f"{run_dir / name} {why}: the run is not done, so it runs on", flush=True)
            return None
    return None


def wrote(run_dir: Path, record: dict) -> str | None:
    """Why ``record`` is not the one the run in ``run_dir`` wrote as it ended, else None: it differs from the
    digest written beside ``done.json`` (``done.sha256``), or, where the run has none (finished before digests were
    written) or its digest differs, from the ``results.json`` its test wrote (naming what differs)."""
    sealed, tested = run_dir / SEALED, run_dir / TESTED
    if sealed.exists() and sealed.read_text().strip() == digest(record):
        return None
    written = read_json(tested) if tested.exists() else None
    differ = _differences(record, written, "") if isinstance(written, dict) else []
    if differ:
        more = f"; and {len(differ) - 4} more" if len(differ) > 4 else ""
        return f"does not match {tested}, which its test wrote ({'; '.join(differ[:4])}{more})"
    if sealed.exists():
        return f"does not match its digest in {sealed}, written as the run ended (edited by hand?)"
    return None


def _differences(record: dict, written: dict, where: str) -> list[str]:
    """Each value of ``written`` that ``record`` holds otherwise: ``metrics.test/loss 0.1, not 6.65``."""
    differ = []
    for key, value in written.items():
        if key not in record:
            differ.append(f"{where}{key} missing")
        elif isinstance(value, dict) and isinstance(record[key], dict):
            differ += _differences(record[key], value, f"{where}{key}.")
        elif record[key] != value:
            differ.append(f"{where}{key} {record[key]!r}, not {value!r}")
    return differ
