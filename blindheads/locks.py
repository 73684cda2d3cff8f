"""Lock files holding their owner's PID: one live ``blindheads fit`` per run directory (``RUN_LOCK``), one live
experiment driver per folder it writes. Below the CLI and the experiments, which both take and read them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from blindheads.atomic import process_alive

RUN_LOCK = ".blindheads.lock"  # in a run directory while its fit runs


def live_owner(path: Path) -> str | None:
    """The PID in lock file ``path`` where that process is alive; None where there is no lock or its owner is gone."""
    owner = _owner(path)
    return owner if owner.isdigit() and process_alive(int(owner)) else None


def take(path: Path, in_use: Callable[[str], Exception], taking_over: Callable[[str], None]) -> None:
    """Create ``path`` holding this PID. A live owner's lock raises ``in_use(pid)``; a dead owner's (a crash, a
    kill) is said (``taking_over(pid)``, ``?`` where it names none), removed, and taken."""
    while True:
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if owner := live_owner(path):
                raise in_use(owner) from None
            taking_over(_owner(path) or "?")
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(descriptor, "w") as file:
            file.write(str(os.getpid()))
        return


def _owner(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:  # let go of since it was seen
        return ""
