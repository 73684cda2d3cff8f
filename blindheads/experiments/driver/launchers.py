"""Where an experiment's runs go with ``--launcher``: each run (one fit + test of one setup and seed, or one arm of
the conjecture) a job of one submitit job array, on this machine (``local``) or on a SLURM cluster (``slurm``), so
the code a cluster runs is the code the tests run. No live driver: submitting returns once the array is queued (the
job ids in ``OUT/jobs.json``); the same command later says what is queued, running, done and failed, collects the
finished runs into the records and the summary as the in-process loop does (``loop``), and resubmits what failed
or is missing, up to ``retries`` times a run. ``--wait`` waits for the whole sweep.

Pre-emption and time limits have one owner, submitit: SLURM sends SIGUSR2 ``signal_delay_s`` seconds before the
end; the job passes a SIGTERM on to its fit (``Driver.stop``), which saves ``last.ckpt`` at the end of its step,
and submitit requeues the job, whose fit resumes from ``last.ckpt`` (Lightning's own SLURM requeue is off:
``cli.lightning``)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import submitit
import yaml

from blindheads import locks
from blindheads.atomic import process_alive
from blindheads.experiments.driver.folders import JOBS, owned
from blindheads.experiments.driver.identity import claim_all, summary_identity, unclaim
from blindheads.experiments.driver.jobs import Driver
from blindheads.experiments.driver.records import read_json, write_json
from blindheads.locks import RUN_LOCK
from blindheads.packaged import located

LAUNCHERS = ("local", "slurm")
SLURM_COMMANDS = ("sbatch", "srun")  # what submitting to SLURM runs: without them this machine is no SLURM login node
T = TypeVar("T")
POLL_S = 10.0  # --wait: seconds between looks at the jobs

# Every launcher setting: its type, its value without a config, and what it is (``--launcher.NAME`` overrides it).
SETTINGS: dict[str, tuple[type, Any, str]] = {
    "partition": (str, None, "the SLURM partition (default: the cluster's)"),
    "nodes": (int, 1, "nodes per run"),
    "gpus_per_node": (int, 0, "GPUs per node: the runs' trainer.devices"),
    "tasks_per_node": (int, 1, "tasks per node: one per GPU (= gpus_per_node), ranks from SLURM"),
    "cpus_per_task": (int, 1, "CPUs per task"),
    "timeout_min": (int, 60, "time limit of one job, in minutes (a run that needs longer is requeued)"),
    "array_parallelism": (int, 16, "runs of the array at once"),
    "signal_delay_s": (int, 120, "seconds before the time limit that SLURM warns the job (--signal=USR2@N)"),
    "retries": (int, 2, "times a failed or lost run is resubmitted before it is named failed"),
    "sbatch": (dict, {}, "further sbatch parameters (on the command line: KEY=VALUE ...)"),
}


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """``--launcher``, ``--launcher-config``, ``--launcher.NAME`` for every setting, and ``--wait``."""
    parser.add_argument("--launcher", choices=LAUNCHERS,
                        help="submit every run as a job of a submitit job array: on this machine (local) or on a SLURM "
                             "cluster (slurm); the same command later reports, collects and resubmits (default: run "
                             "them here, --parallel at once)")  # fmt: skip
    parser.add_argument("--launcher-config", nargs="+", default=[],
                        help="launcher settings (e.g. configs/launcher/slurm.yaml); later files override earlier "
                             "ones")  # fmt: skip
    for name, (kind, default, text) in SETTINGS.items():
        if kind is dict:
            parser.add_argument(f"--launcher.{name}", dest=f"launcher_{name}", nargs="+", metavar="KEY=VALUE",
                                help=text)  # fmt: skip
        else:
            parser.add_argument(f"--launcher.{name}", dest=f"launcher_{name}", type=kind,
                                help=f"{text} (default {default})")  # fmt: skip
    parser.add_argument("--wait", action="store_true", help="with --launcher: wait until every run is done")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The launcher's settings: the defaults, then each ``--launcher-config`` file, then ``--launcher.NAME``; an
    unknown or ill-typed setting is refused, naming the valid ones."""
    values = {name: default for name, (_, default, _) in SETTINGS.items()}
    for file in args.launcher_config:
        loaded = yaml.safe_load(Path(located(file)).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"--launcher-config {file} is no mapping of settings; valid: {', '.join(SETTINGS)}")
        for name, value in loaded.items():
            values[name] = _typed(name, value, f"--launcher-config {file}")
    for name in SETTINGS:
        given = getattr(args, f"launcher_{name}", None)
        if given is not None:
            values[name] = _pairs(given) if SETTINGS[name][0] is dict else given
    for name in ("nodes", "tasks_per_node", "cpus_per_task", "timeout_min", "array_parallelism"):
        if values[name] < 1:
            raise ValueError(f"launcher setting {name} must be >= 1, got {values[name]}")
    for name in ("gpus_per_node", "signal_delay_s", "retries"):
        if values[name] < 0:
            raise ValueError(f"launcher setting {name} must be >= 0, got {values[name]}")
    return values


def _typed(name: str, value: Any, where: str) -> Any:
    if name not in SETTINGS:
        raise ValueError(f"{where}: unknown launcher setting {name!r}; valid: {', '.join(SETTINGS)}")
    kind = SETTINGS[name][0]
    if value is None and name == "partition":
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: launcher setting {name} must be {kind.__name__}, got {value!r}")
    return value


def _pairs(given: list[str]) -> dict[str, str]:
    bad = [item for item in given if "=" not in item]
    if bad:
        raise ValueError(f"--launcher.sbatch takes KEY=VALUE pairs, got {', '.join(bad)}")
    return dict(item.split("=", 1) for item in given)


def executor(launcher: str, folder: Path, values: dict[str, Any]) -> submitit.Executor:
    """The one executor interface: submitit's ``AutoExecutor`` for this machine or a SLURM cluster, with the
    launcher's settings; built before anything is written, so a machine without SLURM (or settings submitit
    refuses) is one line that leaves nothing behind."""
    if launcher == "slurm" and (missing := [name for name in SLURM_COMMANDS if shutil.which(name) is None]):
        raise ValueError(f"--launcher slurm: {' and '.join(missing)} not found on this machine (no SLURM here): run "
                         f"on a SLURM cluster's login node, or pass another launcher; valid: {', '.join(LAUNCHERS)} "
                         "(local: jobs on this machine)")  # fmt: skip
    try:
        chosen = submitit.AutoExecutor(folder=folder, cluster=launcher)
        partition = {"slurm_partition": values["partition"]} if values["partition"] else {}
        chosen.update_parameters(
            timeout_min=values["timeout_min"], nodes=values["nodes"], tasks_per_node=values["tasks_per_node"],
            cpus_per_task=values["cpus_per_task"], **({"gpus_per_node": values["gpus_per_node"]} if values["gpus_per_node"] else {}),
            slurm_array_parallelism=values["array_parallelism"], slurm_signal_delay_s=values["signal_delay_s"],
            slurm_additional_parameters=values["sbatch"], **partition,
        )  # fmt: skip
    except (RuntimeError, ValueError) as error:  # submitit's own refusals: several lines each
        raise ValueError(f"--launcher {launcher}: submitit refused it: {_first_line(error)}; valid launchers: "
                         f"{', '.join(LAUNCHERS)}") from None  # fmt: skip
    return chosen


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def submit_all(chosen: submitit.Executor, launcher: str, program: str, runs: list, made: list[Path]) -> list:
    """Submit ``runs`` as one job array; their jobs. Where the submission fails (sbatch refuses the array), what
    this command made for it is removed (``made``: its claims; submitit's staging files) and the failure is one
    line."""
    folder = Path(chosen.folder)
    before = set(folder.iterdir()) if folder.is_dir() else None
    try:  # submitit prints sbatch's refusal before raising it: the one line below names it
        with contextlib.redirect_stderr(io.StringIO()), chosen.batch():
            return [chosen.submit(RunJob(program), run) for run in runs]
    except RuntimeError as error:  # submitit's FailedJobError: sbatch's own lines
        unclaim(made)
        if before is None:
            shutil.rmtree(folder, ignore_errors=True)
        else:  # a submission's pickles and sbatch files, under submitit's temporary names (a UUID's hex)
            for path in set(folder.iterdir()) - before:
                if re.fullmatch(r"(\.submission_file_)?[0-9a-f]{32}\.(pkl|sh)", path.name):
                    path.unlink(missing_ok=True)
        raise ValueError(f"--launcher {launcher}: submitting {len(runs)} runs failed ({_first_line(error)}); nothing "
                         "was submitted, and what this command wrote for it is removed; valid launchers: "
                         f"{', '.join(LAUNCHERS)}") from None  # fmt: skip


class RunJob(submitit.helpers.Checkpointable):
    """One job of the array: the run's commands, as the in-process loop runs them (``loop.run_commands``), its
    record in its run directory's ``done.json``. Warned of a pre-emption or its time limit (``checkpoint``, on the
    first task only), it stops its fit at a step's end with ``last.ckpt`` saved and is requeued to resume from it."""

    def __init__(self, program: str) -> None:
        self.program = program
        self.driver: Driver | None = None

    def __call__(self, run) -> dict:
        from blindheads.experiments.driver.loop import done_record, run_commands

        record = done_record(run.directory)
        if record is not None:
            return record
        self.driver = Driver(self.program, 1)
        return run_commands(run, self.driver)

    def checkpoint(self, run) -> submitit.helpers.DelayedSubmission:
        if self.driver is not None:
            self.driver.stop(signal.SIGTERM)
        return submitit.helpers.DelayedSubmission(RunJob(self.program), run)


def job(launcher: str, folder: Path, job_id: str) -> submitit.Job:
    """The submitit job ``job_id``, as a command started after it was submitted sees it."""
    return submitit.SlurmJob(folder, job_id) if launcher == "slurm" else submitit.LocalJob(folder, job_id)


def state(launcher: str, folder: Path, job_id: str, run_dir: Path) -> str:
    """``queued``, ``running`` or ``ended`` (done, failed, cancelled or lost: its run directory tells which). A local
    job runs while its controller process (its job id is that PID) or the fit holding its run directory lives."""
    if launcher == "local":
        pid = int(job_id.split("_")[0])
        alive = process_alive(pid) and not _zombie(pid)
        return "running" if alive or locks.live_owner(run_dir / RUN_LOCK) else "ended"
    slurm = job(launcher, folder, job_id).get_info(mode="force").get("State", "UNKNOWN")  # cached state can lag
    if slurm.startswith(("PENDING", "REQUEUE", "CONFIGURING", "SUSPENDED")):
        return "queued"
    return "running" if slurm.startswith(("RUNNING", "COMPLETING")) else "ended"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def failure(launcher: str, folder: Path, job_id: str) -> str:
    """Why an ended job left no finished run: the first line of its error, or that it left no result."""
    found = job(launcher, folder, job_id)
    if not found.paths.result_pickle.exists():
        return "ended without a result (cancelled or lost)"
    try:
        found.result()
    except Exception as error:  # submitit re-raises the job's own error, whatever it is
        lines = str(error).strip().splitlines()  # submitit's report: the job's traceback, then where its logs are
        return next((line for line in reversed(lines) if re.match(r"[\w.]+: ", line)), type(error).__name__)
    return "ended without a record"


def sweep(program: str, args: argparse.Namespace, runs: list, wanted: dict[Path, dict],
          collect: Callable[[list, list], T]) -> T | None:  # fmt: skip
    """The launched experiment: every run's job state read from ``OUT/jobs.json``; the runs not queued or running
    checked and claimed as the in-process loop does; the finished collected, the missing submitted, the failed
    resubmitted (up to ``retries`` tries after the first); the counts printed; with ``--wait``, again until none
    is queued or running. Where every run is done or given up, ``collect(records, remaining)`` writes the summary
    and what it returns is returned; else None."""
    from blindheads.experiments.driver.loop import finished

    values = settings(args)
    if getattr(args, "hours", None):
        raise ValueError(
            "--hours is for runs on this machine; with --launcher each job has the launcher's "
            "timeout_min and is requeued past it"
        )
    out, folder = Path(args.out), Path(args.runs).resolve() / "submitit"
    chosen = executor(args.launcher, folder, values)  # before anything is written: no SLURM here is one line
    files = [file for run in runs for file in run.files]
    said = ""
    while True:
        with owned(out, program, "--out"), owned(Path(args.runs), program, "--runs"):
            book = read_json(out / JOBS) if (out / JOBS).exists() else {"launcher": args.launcher, "jobs": {}}
            if book["launcher"] != args.launcher and book["jobs"]:
                raise ValueError(f"--launcher {args.launcher}: {out / JOBS} holds jobs of --launcher "
                                 f"{book['launcher']}; pass that launcher, or another --out")  # fmt: skip
            jobs = book["jobs"]
            states = {run.name: state(args.launcher, folder, jobs[run.name]["job_id"], run.directory) if run.name in jobs else "new"
                      for run in runs}  # fmt: skip
            idle = [run for run in runs if states[run.name] not in ("queued", "running")]
            made = claim_all({run.directory: wanted[run.directory] for run in idle}, out, summary_identity(args, files))
            records, submit, given_up = {}, [], []
            for run in idle:
                record = finished(run, out, wanted[run.directory])
                if record is not None:
                    records[run.name] = record
                    continue
                tries = jobs.get(run.name, {}).get("tries", 0)
                if tries and tries > values["retries"]:
                    given_up.append(f"{run.name} ({failure(args.launcher, folder, jobs[run.name]['job_id'])}; "
                                    f"{tries} tries)")  # fmt: skip
                elif tries:
                    print(f"blindheads {program}: {run.name} failed "
                          f"({failure(args.launcher, folder, jobs[run.name]['job_id'])}); resubmitting, try "
                          f"{tries + 1} of {values['retries'] + 1}", file=sys.stderr, flush=True)  # fmt: skip
                    submit.append(run)
                else:
                    submit.append(run)
            if submit:
                submitted = submit_all(chosen, args.launcher, program, submit, made)
                for run, queued in zip(submit, submitted, strict=True):
                    jobs[run.name] = {"job_id": queued.job_id, "tries": jobs.get(run.name, {}).get("tries", 0) + 1}
                    states[run.name] = "queued"
                write_json(out / JOBS, book)
            counts = {name: sum(states[run.name] == name for run in runs if run.name not in records)
                      for name in ("queued", "running")}  # fmt: skip
            line = (f"blindheads {program}: {counts['queued']} queued, {counts['running']} running, {len(records)} "
                    f"done, {len(given_up)} failed of {len(runs)} runs" + (f" (job ids in {out / JOBS})" if submit
                    else ""))  # fmt: skip
            if line != said:  # --wait: a line where the counts change
                print(line, flush=True)
                said = line
            if given_up:
                print(f"blindheads {program}: failed after every retry: {', '.join(given_up)}", file=sys.stderr,
                      flush=True)  # fmt: skip
            if len(records) + len(given_up) == len(runs):
                return collect([records[run.name] for run in runs if run.name in records],
                               [run.name for run in runs if run.name not in records])  # fmt: skip
        if not args.wait:
            print(f"blindheads {program}: the same command reports, collects and resubmits", flush=True)
            return None
        time.sleep(POLL_S)
