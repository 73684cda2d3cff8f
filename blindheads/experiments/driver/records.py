"""Records written atomically and read back with a line naming what to do, and the provenance every results file
carries (command, date, wall time, machine, package versions)."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from blindheads import atomic

PACKAGES = ("torch", "lightning", "transformers", "datasets", "tokenizers")  # recorded beside every result


def write_json(path: Path, value, compact: bool = False) -> None:
    """``value`` as indented JSON (``compact``: on one line, for records of long curves), written atomically."""
    atomic.write_text(
        path, (json.dumps(value, separators=(",", ":")) if compact else json.dumps(value, indent=2)) + "\n"
    )


def read_json(path: Path):
    """The JSON in ``path``; an unreadable file is named with what to do."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): a run killed while writing it? remove it and run "
                         "again") from None  # fmt: skip


def provenance_lines(record: dict) -> list[str]:
    """A results table's first lines: the command that wrote it, then when, how long, where and with what."""
    versions = ", ".join(f"{name} {v}" for name, v in record["versions"].items())
    return [
        f"- command: `{record['command']}`",
        f"- date: {record['date']}; {record['wall_s']} s; {record['machine']}; python {record['python']}; {versions}",
    ]


def provenance(command: str, wall_s: float, seeds: list[int]) -> dict:
    """What a results file records beside its numbers: the command, when, how long, the seeds, the machine and the
    versions of the packages that decide the numbers."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "command": command,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),  # this invocation (a resumed experiment counts only its own part)
        "seeds": sorted(set(seeds)),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {cpus} CPUs",
        "versions": {name: version(name) for name in PACKAGES},
    }
