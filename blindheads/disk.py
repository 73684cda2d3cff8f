"""A full disk ends a command in one line: the file it could not write, the space left there, what to do; a
run folder that cannot be written (full, read-only, a file) is refused before the run, in one line. The standard
library only: the ``blindheads`` command itself reads a full disk with it."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

FULL_TEXTS = ("No space left on device", "StorageFull")  # how writers that raise their own errors say it (safetensors)
LEAST_FREE = 1_000_000  # bytes a run needs to start (its lock, config, first event file): below it, the disk is full


def no_space(error: BaseException | None) -> OSError | None:
    """The 'no space left on device' error in ``error``'s chain (torch's writer raises its own C++ error on top)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        if not isinstance(error, OSError) and any(text in str(error) for text in FULL_TEXTS):  # safetensors' own
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        error = error.__cause__ or error.__context__
    return None


class DiskFull(OSError):
    """A write that ran out of space, in one line: the file, the space left there, and what to do: ``advice`` (for a
    run's checkpoint, the newest intact one and ``--ckpt_path last``: ``checkpoints.reading.resume_advice``; by
    default, free some space and run the same command again, which continues where it stopped)."""

    def __init__(self, path: str | Path, advice: str | None = None) -> None:
        path = Path(path)
        existing = _existing(path.parent)
        free = shutil.disk_usage(existing).free
        super().__init__(
            errno.ENOSPC,
            f"no space left on device writing {path} ({_size(free)} free on {existing}): "
            f"{advice or 'free some space, then run the same command again'}",
        )

    def __str__(self) -> str:
        return self.strerror or ""  # always the message given to __init__


def check_writable(folder: str | Path, option: str) -> None:
    """Refuse, before a run starts, a folder it cannot write into, in one line naming it and why: a file in its
    place, a read-only file system or no permission, or a disk already full (less than ``LEAST_FREE``: a disk that
    fills later ends the run with ``DiskFull``)."""
    folder = Path(folder)
    existing = _existing(folder)
    why = None
    if not existing.is_dir():
        why = f"{existing} is a file, not a folder"
    elif os.statvfs(existing).f_flag & os.ST_RDONLY:
        why = f"{existing} is on a read-only file system"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"{existing} is not writable (permissions)"
    elif (free := shutil.disk_usage(existing).free) < LEAST_FREE:
        why = f"no space left on device ({_size(free)} free on {existing})"
    if why:
        raise ValueError(f"{option} {folder} cannot be written: {why}")


def _existing(path: Path) -> Path:
    """``path``, or its nearest folder above that exists (``.`` for a relative path with none)."""
    return next((p for p in (path, *path.parents) if p.exists()), Path("."))


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"
