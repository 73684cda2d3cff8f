"""The config files the code reads itself (the callbacks' defaults, the position setups, the grid's experiment
configs) travel with the package: ``blindheads/configs`` is the repository's ``configs/`` folder (a link to it, so
the files users copy from are the files the code reads), and a wheel holds a copy of it as package data. Found with
``importlib.resources``, so an installed package runs from any folder."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# Every callback's shared settings (cli/callback_set.py reads them). The path is also the key a run's identity records
# their digest under (experiments/driver/identity.py): committed runs hold it, so it stays this string wherever the file lies.
CALLBACK_DEFAULTS = "configs/callbacks/base.yaml"


def packaged(path: str | Path) -> Path:
    """The package's file or folder ``path`` (``configs/...``), its links resolved: in a checkout, the repository's
    own ``configs/...``."""
    found = files("blindheads").joinpath(str(path))
    if not isinstance(found, Path):  # a package imported from a zip archive: no folder to read configs from
        raise FileNotFoundError(f"{path}: blindheads is installed as an archive; install it as files (pip install)")
    return found.resolve()


def located(path: str | Path) -> str:
    """``path`` where it exists from the working directory, else the package's ``path`` (``configs/...``); neither is
    one line naming both folders looked in."""
    if Path(path).exists():
        return str(path)
    if not Path(path).is_absolute() and packaged(path).exists():
        return str(packaged(path))
    raise FileNotFoundError(f"{path} not found (looked in {Path.cwd()} and in the package's {packaged('configs')})")
