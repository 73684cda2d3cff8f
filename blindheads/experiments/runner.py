"""What every experiment (``grid``, ``conjecture``) does with its runs: launch ``blindheads`` subprocesses, key each
run directory by everything that decides its result, and write its records atomically.

A run directory remembers the options it was made with (``options.json``: the command line, the environment it set,
and the text of every config file it read). A later invocation with other options is refused, naming the
difference, instead of reusing runs that answer another question. The summary folder (``--out``) remembers the
driver's options the same way.

One live driver owns its ``--out`` and ``--runs`` (a lock file holding its PID). A driver's jobs run in their own
process groups: a terminal's Ctrl-C reaches only the driver, which forwards SIGINT and SIGTERM (a scheduler's
pre-emption) to every live job, waits for them to save ``last.ckpt``, and exits in one line with 128 + the signal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar

import yaml

from blindheads import atomic, locks, signals
from blindheads.checkpoints.reading import newest_intact
from blindheads.experiments.setups import located
from blindheads.locks import RUN_LOCK
from blindheads.packaged import CALLBACK_DEFAULTS, packaged
from blindheads.signals import Interrupted

PACKAGES = ("torch", "lightning", "transformers", "datasets", "tokenizers")  # recorded beside every result
DRIVER_LOCK = ".blindheads-driver.lock"
RECORDS = "records"  # the summary folder's copy of every finished run's record (``loop``): kept across summaries
# glibc hands the pages of a large freed tensor back and faults them in again at the next one: a quarter of an
# evaluation's time went to the kernel. Kept at the heap's top they are reused (a variable the user set wins).
KEEP_FREED_MEMORY = {"MALLOC_TRIM_THRESHOLD_": str(16 << 30), "MALLOC_TOP_PAD_": str(1 << 30)}
T = TypeVar("T")


class RunChanged(ValueError):
    """A run directory was made with other options than the ones asked for now, or is in use."""


class JobFailed(RuntimeError):
    """A ``blindheads`` job of the experiment exited with an error (not because the driver was signalled)."""


def configs(files: list[str]) -> list[str]:
    """``--config FILE`` for each file, in order: later files override earlier ones."""
    return [option for file in files for option in ("--config", file)]


def distinct(option: str, values: list) -> None:
    """Refuse a value listed twice: a seed counted twice, or two jobs writing one run directory and one log."""
    twice = [value for value, count in Counter(values).items() if count > 1]
    if twice:
        listed = ", ".join(map(str, twice))
        raise ValueError(f"{option} lists {listed} more than once; give each once")


def at_least(option: str, values: list[int], low: int) -> None:
    """Refuse a number below ``low`` before anything is trained (not after the first fit fails on it)."""
    bad = [value for value in values if value < low]
    if bad:
        raise ValueError(f"{option} must be >= {low}, got {', '.join(map(str, bad))}")


def checked(args):
    """The options every experiment has, checked before anything runs: distinct seeds >= 0, --parallel >= 1, config
    files found (``located``), --out (by default the runs' folder + ``-summary``, never a committed results folder)
    apart from --runs; the options after ``--`` without it."""
    distinct("--seeds", args.seeds)
    at_least("--seeds", args.seeds, 0)
    at_least("--parallel", [args.parallel], 1)
    if getattr(args, "hours", None) is not None and not args.hours > 0:
        raise ValueError(f"--hours must be > 0, got {args.hours}")
    args.config = [located(file) for file in args.config]
    args.out = args.out or f"{Path(args.runs)}-summary"
    separate(Path(args.out), Path(args.runs))
    args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    return args


def separate(out: Path, runs: Path) -> None:
    """Refuse a summary folder that is, holds or lies in the runs' folder: replacing the summary would take runs."""
    out, runs = out.resolve(), runs.resolve()
    if out == runs or out in runs.parents or runs in out.parents:
        raise ValueError(f"--out {out} and --runs {runs} overlap; give them separate folders")


class Driver:
    """Runs an experiment's jobs, each a ``blindheads`` subprocess in its own process group (so a terminal's Ctrl-C
    reaches only the driver), and passes SIGINT and SIGTERM on to every live job. A signalled job saves
    ``last.ckpt`` and exits; no new job starts; leaving the ``with`` block prints one line, how many runs were saved,
    and exits with 128 + the signal. A job that fails is one line naming its log."""

    def __init__(self, program: str, parallel: int) -> None:
        self.program, self.parallel = program, parallel
        self.signum: int | None = None
        self._live: dict[subprocess.Popen, Path] = {}  # job -> its run directory
        self._stopped: set[Path] = set()  # run directories whose job was signalled
        self._lock = threading.Lock()  # a job starts wholly before or after a signal is passed on
        self._forwarding = contextlib.ExitStack()

    def __enter__(self) -> Driver:
        self._forwarding.enter_context(signals.handling((signal.SIGINT, signal.SIGTERM), self._forward))
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self._forwarding.close()
        if self.signum is not None and (error is None or isinstance(error, Interrupted)):
            saved = sum(bool(resume_option(run_dir)) for run_dir in self._stopped)
            signals.exit_after(Interrupted(self.signum, f"blindheads {self.program}: interrupted: {saved} runs saved; "
                                           "rerun the same command to continue"))  # fmt: skip
        if isinstance(error, JobFailed):
            sys.exit(f"blindheads {self.program}: error: {error}")

    def _forward(self, signum: int, frame) -> None:
        with self._lock:
            self.signum = self.signum or signum
            for job, run_dir in self._live.items():
                self._stopped.add(run_dir)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.pid, signum)

    def _interrupted(self) -> Interrupted:
        """What a job that stopped, or never started, because the driver was signalled raises."""
        assert self.signum is not None
        return Interrupted(self.signum, f"blindheads {self.program}: stopped by {signal.Signals(self.signum).name}")

    def launch(self, command: list[str], run_dir: Path, env: dict | None = None) -> None:
        """``blindheads COMMAND`` for ``run_dir``, its output appended to ``RUN_DIR.COMMAND.log`` beside it (a log
        is never truncated: a resumed run's follows its first part); one thread when runs share the machine."""
        if self.signum is not None:  # interrupted: the runs still queued start nothing, not even their logs
            raise self._interrupted()
        log = run_dir.parent / f"{run_dir.name}.{command[0]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        threads = {"OMP_NUM_THREADS": "1"} if self.parallel > 1 else {}
        env = {**KEEP_FREED_MEMORY, **os.environ, **threads, **(env or {})}
        with open(log, "a") as out:
            with self._lock:
                if self.signum is not None:
                    raise self._interrupted()
                out.write(f"--- blindheads {command[0]}, started {datetime.now().isoformat(timespec='seconds')}\n")
                out.flush()
                job = subprocess.Popen([sys.executable, "-m", "blindheads", *command], stdout=out,
                                       stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)  # fmt: skip
                self._live[job] = run_dir
            code = job.wait()
            with self._lock:
                del self._live[job]
        if self.signum is not None:
            raise self._interrupted()
        if code:
            lines = [line.strip() for line in log.read_text().splitlines() if line.strip()]
            last = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
            raise JobFailed(f"blindheads {command[0]} for {run_dir} exited with {code} ({last}); see {log}")


@contextlib.contextmanager
def experiment(program: str, args, wanted: dict[Path, dict], config_files: list[str]) -> Iterator[Driver]:
    """An experiment's driver at work: its ``--out`` and ``--runs`` owned, the summary folder and every run directory
    checked then claimed (``wanted``: run directory -> identity), SIGINT and SIGTERM passed on to its jobs."""
    out, runs = Path(args.out), Path(args.runs)
    with owned(out, program, "--out"), owned(runs, program, "--runs"), Driver(program, args.parallel) as driver:
        claim_all(wanted, out, summary_identity(args, config_files))
        yield driver


@contextlib.contextmanager
def owned(directory: Path, program: str, option: str) -> Iterator[None]:
    """``directory`` (an experiment's ``--out`` or ``--runs``) for this driver alone while it runs: its PID in
    ``DIRECTORY/.blindheads-driver.lock``. A live owner refuses this driver, naming its PID; a dead one's lock is
    taken over, saying so. A directory that cannot be written is refused before anything runs."""
    path = directory / DRIVER_LOCK
    try:
        directory.mkdir(parents=True, exist_ok=True)
        locks.take(
            path,
            lambda owner: ValueError(f"{option} {directory} is in use by a live driver (pid {owner}); wait for it to "
                                     f"end or pass another {option}"),
            lambda owner: print(f"blindheads {program}: taking over {directory} from pid {owner}, which is no longer "
                                "running", file=sys.stderr, flush=True),
        )  # fmt: skip
        _restore(directory, program)
    except OSError as error:
        raise ValueError(f"{option} {directory} cannot be written ({error.strerror}); pass another {option}") from None
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            directory.rmdir()  # if this driver left it empty (refused before it wrote anything)


def publish(out: Path, write: Callable[[Path], T]) -> T:
    """The summary whole or not at all: ``write`` fills a staging folder beside ``out`` (with a copy of ``out``'s
    ``options.json``, lock and kept run records), which then replaces ``out`` by two renames: the old folder aside, the new one in.
    A reader sees the old summary or the new one, never tables of one and ``results.json`` of the other; a driver
    killed while writing leaves a staging folder the next one removes, one killed between the renames leaves the old
    summary aside, and the next driver puts it back (``owned``)."""
    atomic.remove_debris(out.parent, out.name)
    staging, aside = atomic.staging_path(out), out.with_name(f".{out.name}.previous-{os.getpid()}")
    staging.mkdir()
    try:
        for name in ("options.json", DRIVER_LOCK):
            if (out / name).exists():
                shutil.copy2(out / name, staging / name)
        if (out / RECORDS).is_dir():
            shutil.copytree(out / RECORDS, staging / RECORDS)
        written = write(staging)
    except BaseException:
        shutil.rmtree(staging)
        raise
    out.rename(aside)
    staging.rename(out)
    shutil.rmtree(aside)
    return written


def _restore(out: Path, program: str) -> None:
    """Under ``out``'s lock, finish what a driver killed inside ``publish`` left: the old summary it had set aside
    goes back where ``out`` is missing (now holding only this driver's lock), or is removed where the new one is in."""
    for aside in out.parent.glob(f".{out.name}.previous-*"):
        if [p.name for p in out.iterdir()] == [DRIVER_LOCK]:
            os.replace(out / DRIVER_LOCK, aside / DRIVER_LOCK)
            out.rmdir()
            aside.rename(out)
            print(f"blindheads {program}: restored {out} from {aside.name}, set aside by a driver killed while "
                  "replacing it", file=sys.stderr, flush=True)  # fmt: skip
        else:
            shutil.rmtree(aside)


def resume_option(run_dir: Path) -> list[str]:
    """``--ckpt_path last`` where a killed run left an intact checkpoint to continue from, else nothing."""
    return ["--ckpt_path", "last"] if newest_intact(run_dir / "checkpoints") else []


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
    """What decides an experiment's summary: the driver's options but where it is written, how many run at once
    and how long this part may take, and its config files' contents."""
    options = []
    for name, value in vars(args).items():
        if name not in ("out", "parallel", "hours"):
            options += [
                "--" if name == "extra" else f"--{name}",
                *map(str, value if isinstance(value, list) else [value]),
            ]
    return identity(options, config_files)


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
    elif run_dir.exists() and any(p.name != DRIVER_LOCK for p in run_dir.iterdir()):
        raise RunChanged(f"{run_dir} holds files made without a record of their options; remove it or pass another "
                         f"{option}")  # fmt: skip


def claim(run_dir: Path, wanted: dict, option: str = "--runs") -> None:
    """Check ``run_dir`` and record the options it is made with."""
    check(run_dir, wanted, option)
    if not (run_dir / "options.json").exists():
        write_json(run_dir / "options.json", wanted)


def claim_all(wanted: dict[Path, dict], out: Path, summary: dict) -> None:
    """Check the summary folder and every run directory, then claim each: a refusal (one line, naming the
    difference) leaves nothing claimed or started."""
    check(out, summary, "--out")
    for run_dir, options in wanted.items():
        check(run_dir, options)
    claim(out, summary, "--out")
    for run_dir, options in wanted.items():
        claim(run_dir, options)


def _pairs(options: list[str]) -> list[str]:
    """``["--a", "1", "--b"]`` -> ``["--a 1", "--b"]``: each option with its value, to name what changed."""
    pairs: list[str] = []
    for token in options:
        if pairs and not token.startswith("--") and " " not in pairs[-1]:
            pairs[-1] += f" {token}"
        else:
            pairs.append(token)
    return pairs


def difference(before: dict, now: dict) -> str:
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
