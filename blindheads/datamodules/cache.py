"""Folders of the cache (``data.cache_dir``): a file where a folder belongs is named in one line, instead of failing
later as a bare 'File exists' or as a tokenizer that cannot be loaded."""

from __future__ import annotations

from pathlib import Path


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
