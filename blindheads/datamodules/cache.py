"""Folders of the cache (``data.cache_dir``): a file where a folder belongs is named in one line, instead of failing
later as a bare 'File exists' or as a tokenizer that cannot be loaded.

The project removes a cache folder only if it made it: every folder it builds (the builtin corpus, the builtin
tokenizer) holds a mark (``MARK``) written before the folder is renamed into place, and a damaged folder is rebuilt
only where the mark is found; one without it is named and left alone, whatever path led to it."""

from __future__ import annotations

import shutil
from pathlib import Path

MARK = ".made-by-blindheads"  # in every cache folder the project builds: only such a folder is ever removed


def cache_folder(path: Path, what: str) -> Path:
    """``path``, once its nearest existing part is known to be a directory; ``what`` says what the folder holds."""
    for part in (path, *path.parents):
        if part.is_dir():
            return path
        if part.exists() or part.is_symlink():
            kind = "a broken link" if part.is_symlink() and not part.exists() else "a file"
            raise ValueError(
                f"{part} is {kind}, expected a directory for {what}: move or delete it, or choose another "
                "--data.cache_dir"
            )
    return path


def mark(folder: Path) -> None:
    """Mark ``folder`` (a staging folder about to be renamed into place) as made by the project."""
    (folder / MARK).write_text("made by blindheads: removed and rebuilt when damaged\n")


def made_here(folder: Path) -> bool:
    """Whether ``folder`` is a real directory (no link) holding the project's mark."""
    return folder.is_dir() and not folder.is_symlink() and (folder / MARK).is_file()


def check_made(folder: Path, what: str, why: str) -> None:
    """Refuse, in one line naming it, to rebuild ``folder`` (which holds ``what`` and is damaged: ``why``) unless
    the project made it: a folder without the mark may be anyone's, whatever path led to it."""
    if not made_here(folder):
        raise ValueError(
            f"{folder} {why}, and it was not made by blindheads (no {MARK} in it), so it is left alone: move or "
            f"delete it to rebuild {what} there, or choose another --data.cache_dir"
        )


def remove_made(folder: Path, what: str, why: str) -> None:
    """Remove the damaged ``folder`` if the project made it (``check_made``)."""
    check_made(folder, what, why)
    shutil.rmtree(folder)
