"""Which checkpoint files are whole: what ``--ckpt_path last`` may resume from."""

from __future__ import annotations

import zipfile
from pathlib import Path


def intact(path: Path) -> bool:
    """Whether ``path`` is a whole checkpoint file: torch writes a zip archive, whose directory sits at its end."""
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def newest_intact(directory: Path) -> Path | None:
    """The most recently written whole checkpoint in ``directory`` (``last.ckpt`` on a tie): what a run resumes from
    when a later save failed part-way, as on a full disk."""
    found = [p for p in Path(directory).glob("*.ckpt") if p.is_file() and intact(p)]
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt"), default=None)
