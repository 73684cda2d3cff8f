"""Notebook paths mean the same wherever Jupyter was started: a relative path is taken from the repository (the
checkout this package is installed from), not from the folder the kernel happens to run in."""

from __future__ import annotations

from pathlib import Path

import blindheads


def repository() -> Path:
    """The checkout of an editable install, else the nearest folder above the working directory that holds this
    package's ``pyproject.toml``, else the working directory."""
    for folder in (Path(blindheads.__file__).resolve().parents[1], Path.cwd(), *Path.cwd().parents):
        if (folder / "pyproject.toml").is_file() and (folder / "blindheads").is_dir():
            return folder
    return Path.cwd()


def from_repository(path: str | Path) -> Path:
    """``path`` itself when absolute, else the repository's ``path``."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else repository() / path
