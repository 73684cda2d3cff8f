"""Files written whole or not at all: a sibling file (or folder) renamed over the target, so a kill never leaves
half of one; what a killed writer left is recognised by its process ID and removed by the next writer."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def process_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_path(target: Path) -> Path:
    """Where this process writes ``target`` before renaming it into place."""
    return target.with_name(f".{target.name}.partial-{os.getpid()}")


def remove_debris(folder: Path, name: str = "*") -> None:
    """Staging files and folders for ``name`` (a glob) in ``folder`` left by writers that were killed (their process
    is gone)."""
    for debris in folder.glob(f".{name}.partial-*"):
        pid = debris.name.rpartition("-")[2]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(debris, ignore_errors=True) if debris.is_dir() else debris.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_path(path)
    try:
        staging.write_text(text)
        os.replace(staging, path)
    except OSError as error:
        if error.filename is None:  # a failed write() names no file: name the one being written (a full disk)
            error.filename = str(path)
        raise
    finally:
        staging.unlink(missing_ok=True)
