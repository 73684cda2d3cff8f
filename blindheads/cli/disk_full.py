"""A full disk ends a run in one line: the file it could not write, the space left there, the checkpoint to resume from."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from blindheads.cli.checkpoint_files import newest_intact


def no_space(error: BaseException | None) -> OSError | None:
    """The 'no space left on device' error in ``error``'s chain (torch's writer raises its own C++ error on top)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        error = error.__cause__ or error.__context__
    return None


class DiskFull(OSError):
    """A write that ran out of space, in one line: the file, the space left there, and the checkpoint to resume from
    (``--ckpt_path last`` takes the newest intact one)."""

    def __init__(self, path: str | Path, checkpoints: str | Path | None = None) -> None:
        path = Path(path)
        existing = next(p for p in path.parents if p.exists())
        free = shutil.disk_usage(existing).free
        resume = newest_intact(Path(checkpoints)) if checkpoints is not None else None
        then = f"the newest intact checkpoint is {resume}; " if resume else ""
        super().__init__(
            errno.ENOSPC,
            f"no space left on device writing {path} ({_size(free)} free on {existing}): {then}free some space, then "
            "resume with --ckpt_path last",
        )

    def __str__(self) -> str:
        return self.strerror


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"
