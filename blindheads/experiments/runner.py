"""What every experiment (``grid``, ``conjecture``) does with its runs: launch ``blindheads`` subprocesses, key each
run directory by everything that decides its result, and write its records atomically.

A run directory remembers the options it was made with (``options.json``: the command line, the environment it set,
and the text of every config file it read). A later invocation with other options is refused, naming the
difference, instead of reusing runs that answer another question.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import yaml

from blindheads import atomic
from blindheads.cli.checkpoint_files import newest_intact

PACKAGES = ("torch", "lightning", "transformers", "datasets", "tokenizers")  # recorded beside every result


class RunChanged(RuntimeError):
    """A run directory was made with other options than the ones asked for now."""


def configs(files: list[str]) -> list[str]:
    """``--config FILE`` for each file, in order: later files override earlier ones."""
    return [option for file in files for option in ("--config", file)]


def launch(command: list[str], log: Path, parallel: int, env: dict | None = None) -> None:
    """``blindheads COMMAND`` in a subprocess, its output in ``log``; one thread when runs share the machine."""
    log.parent.mkdir(parents=True, exist_ok=True)
    threads = {"OMP_NUM_THREADS": "1"} if parallel > 1 else {}
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "blindheads", *command], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, **threads, **(env or {})})  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"blindheads {command[0]} failed; see {log}")


def resume_option(run_dir: Path) -> list[str]:
    """``--ckpt_path last`` where a killed run left an intact checkpoint to continue from, else nothing."""
    return ["--ckpt_path", "last"] if newest_intact(run_dir / "checkpoints") else []


def config_texts(files: list[str]) -> dict[str, str]:
    """Each config file's SHA-256, and that of every YAML file it names (``callbacks: ../callbacks/x.yaml``)."""
    digests, pending = {}, [Path(f) for f in files]
    while pending:
        path = pending.pop()
        if str(path) in digests or not path.is_file():
            continue
        text = path.read_text()
        digests[str(path)] = hashlib.sha256(text.encode()).hexdigest()[:16]
        pending += [path.parent / name for name in _yaml_names(yaml.safe_load(text))]
    return dict(sorted(digests.items()))


def _yaml_names(node) -> list[str]:
    if isinstance(node, dict):
        return [n for value in node.values() for n in _yaml_names(value)]
    if isinstance(node, list):
        return [n for value in node for n in _yaml_names(value)]
    return [node] if isinstance(node, str) and node.endswith((".yaml", ".yml")) else []


def identity(options: list[str], config_files: list[str], env: dict | None = None) -> dict:
    """What decides a run's result: its options, the environment it sets, its config files' contents."""
    return {"options": options, "env": env or {}, "configs": config_texts(config_files)}


def check(run_dir: Path, wanted: dict) -> None:
    """Refuse ``run_dir`` if it was made with other options than ``wanted`` (naming the difference)."""
    marker = run_dir / "options.json"
    if marker.exists():
        before = read_json(marker)
        if before != wanted:
            raise RunChanged(f"{run_dir} was made with other options ({_difference(before, wanted)}); remove it "
                             "to run it again with these, or pass another --runs")  # fmt: skip
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise RunChanged(
            f"{run_dir} holds a run made without a record of its options; remove it or pass another --runs"
        )


def claim(run_dir: Path, wanted: dict) -> None:
    """Check ``run_dir`` and record the options it is made with."""
    check(run_dir, wanted)
    if not (run_dir / "options.json").exists():
        write_json(run_dir / "options.json", wanted)


def claim_all(wanted: dict[Path, dict], program: str) -> None:
    """Check every run directory, then claim each: a refusal (one line, naming the difference) leaves nothing
    claimed or started."""
    try:
        for run_dir, options in wanted.items():
            check(run_dir, options)
    except RunChanged as error:
        raise SystemExit(f"blindheads {program}: {error}") from None
    for run_dir, options in wanted.items():
        claim(run_dir, options)


def _pairs(options: list[str]) -> list[str]:
    """``["--a", "1", "--b"]`` -> ``["--a 1", "--b"]``: each option with its value, to name what changed."""
    pairs = []
    for token in options:
        if pairs and not token.startswith("--") and " " not in pairs[-1]:
            pairs[-1] += f" {token}"
        else:
            pairs.append(token)
    return pairs


def _difference(before: dict, now: dict) -> str:
    parts = []
    then_options, now_options = _pairs(before["options"]), _pairs(now["options"])
    removed = [o for o in then_options if o not in now_options]
    added = [o for o in now_options if o not in then_options]
    if removed or added:
        parts.append(f"then {', '.join(removed) or 'nothing else'}; now {', '.join(added) or 'nothing else'}")
    if before["env"] != now["env"]:
        parts.append(f"environment then {before['env']}, now {now['env']}")
    changed = sorted(
        k for k in {*before["configs"], *now["configs"]} if before["configs"].get(k) != now["configs"].get(k)
    )
    if changed:
        parts.append(f"config files changed since: {', '.join(changed)}")
    return "; ".join(parts) or "they differ"


def write_json(path: Path, value) -> None:
    """``value`` as indented JSON, written atomically."""
    atomic.write_text(path, json.dumps(value, indent=2) + "\n")


def read_json(path: Path):
    """The JSON in ``path``; an unreadable file is named with what to do."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): a run killed while writing it? remove it and run "
                         "again") from None  # fmt: skip


def provenance(command: str, wall_s: float, seeds: list[int]) -> dict:
    """What a results file records beside its numbers: the command, when, how long, the seeds, the machine and the
    versions of the packages that decide the numbers."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "command": command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),  # this invocation (a resumed experiment counts only its own part)
        "seeds": sorted(set(seeds)),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {cpus} CPUs",
        "versions": {name: version(name) for name in PACKAGES},
    }
