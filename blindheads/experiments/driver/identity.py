"""What decides a run's result (its identity), recorded where it is made: a run directory remembers the options it was
made with (``options.json``: the command line, the environment it set, and the digest of every config file it read,
the callbacks' defaults included). A later invocation with other options is refused, naming the difference, instead of
reusing runs that answer another question. The summary folder (``--out``) remembers the driver's options the same way."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import yaml

from blindheads import locks
from blindheads.experiments.driver.folders import DRIVER_LOCK, NOTES, RECORDS
from blindheads.experiments.driver.records import read_json, write_json
from blindheads.locks import RUN_LOCK
from blindheads.packaged import CALLBACK_DEFAULTS, packaged


class RunChanged(ValueError):
    """A run directory was made with other options than the ones asked for now, or is in use."""


def config_texts(files: list[str]) -> dict[str, str]:
    """Each config file's SHA-256, and that of every YAML file it names (``strategy: ../strategies/ddp.yaml``)."""
    digests, pending = {}, [Path(f) for f in files]
    while pending:
        path = pending.pop()
        if str(path) in digests or not path.is_file():
            continue
        text = path.read_text()
        digests[str(path)] = _digest(text)
        pending += [path.parent / name for name in _yaml_names(yaml.safe_load(text))]
    return dict(sorted(digests.items()))


def _yaml_names(node) -> list[str]:
    if isinstance(node, dict):
        return [n for value in node.values() for n in _yaml_names(value)]
    if isinstance(node, list):
        return [n for value in node for n in _yaml_names(value)]
    return [node] if isinstance(node, str) and node.endswith((".yaml", ".yml")) else []


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def identity(options: list[str], config_files: list[str], env: dict | None = None) -> dict:
    """What decides a run's result: its options, the environment it sets, its config files' contents, and the
    callback settings every config builds on."""
    configs = config_texts(config_files)
    configs[CALLBACK_DEFAULTS] = _digest(packaged(CALLBACK_DEFAULTS).read_text())  # the key committed runs hold
    return {"options": options, "env": env or {}, "configs": dict(sorted(configs.items()))}


def summary_identity(args, config_files: list[str]) -> dict:
    """What decides an experiment's summary: the driver's options but where it is written, how many run at once,
    how long this part may take and where its jobs run (``--launcher`` and its settings, ``--wait``), and its config
    files' contents."""
    options = []
    for name, value in vars(args).items():
        if name not in ("out", "parallel", "hours", "wait") and not name.startswith("launcher"):
            options += [
                "--" if name == "extra" else f"--{name}",
                *map(str, value if isinstance(value, list) else [value]),
            ]
    return identity(options, config_files)


# What a folder may hold before it is claimed. A summary folder holding only kept records takes them on: each names
# its run's options and is checked against them one by one (``loop.complete``), so an experiment whose setups or
# configs changed carries its finished runs into a new summary by starting one from its ``records/``. Its
# ``README.md`` is a person's (the design and decision rule, written before the runs): no summary writes or reads it.
_UNCLAIMED = {"--out": (DRIVER_LOCK, RECORDS, NOTES)}


def check(run_dir: Path, wanted: dict, option: str = "--runs") -> None:
    """Refuse ``run_dir`` if it was made with other options than ``wanted`` (naming the difference), or if a live
    run holds it (a job an earlier driver left running: its log and checkpoints are still being written)."""
    marker = run_dir / "options.json"
    if owner := locks.live_owner(run_dir / RUN_LOCK):
        raise RunChanged(f"{run_dir} is in use by a live run (pid {owner}); wait for it to end or stop it")
    if marker.exists():
        before = read_json(marker)
        if before != wanted:
            raise RunChanged(f"{run_dir} was made with other options ({difference(before, wanted)}); remove it "
                             f"to run it again with these, or pass another {option}")  # fmt: skip
    elif run_dir.exists() and any(p.name not in _UNCLAIMED.get(option, (DRIVER_LOCK,)) for p in run_dir.iterdir()):
        raise RunChanged(f"{run_dir} holds files made without a record of their options; remove it or pass another "
                         f"{option}")  # fmt: skip


def claim(run_dir: Path, wanted: dict, option: str = "--runs") -> list[Path]:
    """Check ``run_dir`` and record the options it is made with; the paths this made (its ``options.json``, then
    each folder made for it, deepest first), for ``unclaim``."""
    check(run_dir, wanted, option)
    marker = run_dir / "options.json"
    if marker.exists():
        return []
    made = [marker, *(folder for folder in (run_dir, *run_dir.parents) if not folder.exists())]
    write_json(marker, wanted)
    return made


def claim_all(wanted: dict[Path, dict], out: Path, summary: dict) -> list[Path]:
    """Check the summary folder and every run directory, then claim each: a refusal (one line, naming the
    difference) leaves nothing claimed or started. The paths it made, for ``unclaim``."""
    check(out, summary, "--out")
    for run_dir, options in wanted.items():
        check(run_dir, options)
    made = claim(out, summary, "--out")
    for run_dir, options in wanted.items():
        made += claim(run_dir, options)
    return made


def unclaim(made: list[Path]) -> None:
    """Undo ``claim_all``: remove the options files it wrote, then the folders it made for them where they are still
    empty (nothing else is touched)."""
    for path in made:
        if path.name == "options.json":
            path.unlink(missing_ok=True)
    for path in made:
        if path.name != "options.json":
            with contextlib.suppress(OSError):
                path.rmdir()


def _given(options: list[str]) -> dict[str, list[str]]:
    """``["--a", "1", "2", "--b", "--c=3"]`` -> ``{"--a": ["1 2"], "--b": [""], "--c": ["3"]}``: each option with
    the values it was given, one entry per time it was given."""
    given: dict[str, list[str]] = {}
    values: list[str] | None = None
    for token in options:
        if token.startswith("--") or values is None:
            name, sep, value = token.partition("=") if token.startswith("--") else (token, "", "")
            given.setdefault(name, []).append(value if sep else "")
            values = given[name]
        else:
            values[-1] = f"{values[-1]} {token}".strip()
    return given


def _shown(values: list[str] | None) -> str:
    if values is None:
        return "(not given)"
    return ", ".join(value or "(given)" for value in values)


def difference(before: dict, now: dict) -> str:
    """What differs between two identities: each option with its old and new values (``--seeds 0 1 -> 0``,
    ``--hours (not given) -> 1``), the environment, the config files whose contents changed."""
    parts = []
    then_given, now_given = _given(before["options"]), _given(now["options"])
    for name in dict.fromkeys([*then_given, *now_given]):
        if then_given.get(name) != now_given.get(name):
            parts.append(f"{name} {_shown(then_given.get(name))} -> {_shown(now_given.get(name))}")
    if before["env"] != now["env"]:
        parts.append(f"environment {before['env']} -> {now['env']}")
    changed = sorted(
        k for k in {*before["configs"], *now["configs"]} if before["configs"].get(k) != now["configs"].get(k)
    )
    if changed:
        parts.append(f"config files changed since: {', '.join(changed)}")
    return "; ".join(parts) or "they differ"
