"""Files written whole or not at all: a sibling file renamed over the target, so a kill never leaves half of one."""

from __future__ import annotations

import os
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        staging.write_text(text)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
