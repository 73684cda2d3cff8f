"""The folders a driver owns: one live driver per ``--out`` and ``--runs`` (a lock file holding its PID), the summary
published whole, what a killed writer left in its records removed, a killed run's checkpoint to resume from."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from blindheads import atomic, locks
from blindheads.checkpoints.reading import newest_intact

DRIVER_LOCK = ".blindheads-driver.lock"


JOBS = "jobs.json"  # a launched sweep's jobs (``launchers``): kept across summaries
RECORDS = "records"  # the summary folder's copy of every finished run's record (``loop``): kept across summaries
NOTES = "README.md"  # a person's notes on the results (no summary writes one): kept across summaries


T = TypeVar("T")


@contextlib.contextmanager
def owned(directory: Path, program: str, option: str) -> Iterator[None]:
    """``directory`` (an experiment's ``--out`` or ``--runs``) for this driver alone while it runs: its PID in
    ``DIRECTORY/.blindheads-driver.lock``. A live owner refuses this driver, naming its PID; a dead one's lock is
    taken over, saying so; a record a killed writer left part-written in its ``records/`` is removed, saying so. A
    directory that cannot be written is refused before anything runs."""
    path = directory / DRIVER_LOCK
    try:
        directory.mkdir(parents=True, exist_ok=True)
        locks.take(
            path,
            lambda owner: ValueError(f"{option} {directory} is in use by a live driver (pid {owner}); wait for it to "
                                     f"end or pass another {option}"),
            lambda owner: print(f"blindheads {program}: taking over {directory} from pid {owner}, which is no longer "
                                "running", file=sys.stderr, flush=True),
        )  # fmt: skip
        _restore(directory, program)
        _remove_partial_records(directory / RECORDS, program)
    except OSError as error:
        raise ValueError(f"{option} {directory} cannot be written ({error.strerror}); pass another {option}") from None
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            directory.rmdir()  # if this driver left it empty (refused before it wrote anything)


def publish(out: Path, write: Callable[[Path], T]) -> T:
    """The summary whole or not at all: ``write`` fills a staging folder beside ``out`` (with a copy of ``out``'s
    ``options.json``, lock, jobs, notes and kept run records), which then replaces ``out`` by two renames: the old
    folder aside, the new one in.
    A reader sees the old summary or the new one, never tables of one and ``results.json`` of the other; a driver
    killed while writing leaves a staging folder the next one removes, one killed between the renames leaves the old
    summary aside, and the next driver puts it back (``owned``)."""
    atomic.remove_debris(out.parent, out.name)
    staging, aside = atomic.staging_path(out), out.with_name(f".{out.name}.previous-{os.getpid()}")
    staging.mkdir()
    try:
        for name in ("options.json", DRIVER_LOCK, JOBS, NOTES):
            if (out / name).exists():
                shutil.copy2(out / name, staging / name)
        if (out / RECORDS).is_dir():
            shutil.copytree(out / RECORDS, staging / RECORDS)
        written = write(staging)
    except BaseException:
        shutil.rmtree(staging)
        raise
    out.rename(aside)
    staging.rename(out)
    shutil.rmtree(aside)
    return written


def _restore(out: Path, program: str) -> None:
    """Under ``out``'s lock, finish what a driver killed inside ``publish`` left: the old summary it had set aside
    goes back where ``out`` is missing (now holding only this driver's lock), or is removed where the new one is in."""
    for aside in out.parent.glob(f".{out.name}.previous-*"):
        if [p.name for p in out.iterdir()] == [DRIVER_LOCK]:
            os.replace(out / DRIVER_LOCK, aside / DRIVER_LOCK)
            out.rmdir()
            aside.rename(out)
            print(f"blindheads {program}: restored {out} from {aside.name}, set aside by a driver killed while "
                  "replacing it", file=sys.stderr, flush=True)  # fmt: skip
        else:
            shutil.rmtree(aside)


def _remove_partial_records(records: Path, program: str) -> None:
    """The staging files of records whose writer was killed (``atomic``'s ``.NAME.partial-PID``, PID gone), each
    removed with a line: else every summary would copy them on."""
    if not records.is_dir():
        return
    before = set(records.iterdir())
    atomic.remove_debris(records)
    for path in sorted(before - set(records.iterdir())):
        print(f"blindheads {program}: removed {path}, a record left part-written by a killed driver", file=sys.stderr,
              flush=True)  # fmt: skip


def resume_option(run_dir: Path) -> list[str]:
    """``--ckpt_path last`` where a killed run left an intact checkpoint to continue from, else nothing."""
    return ["--ckpt_path", "last"] if newest_intact(run_dir / "checkpoints") else []
