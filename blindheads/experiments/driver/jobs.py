"""An experiment's jobs: each a ``blindheads`` subprocess in its own process group, so a terminal's Ctrl-C reaches only
the driver, which forwards SIGINT and SIGTERM (a scheduler's pre-emption) to every live job, waits for them to save
``last.ckpt``, and exits in one line with 128 + the signal (``blindheads.signals``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from blindheads import signals
from blindheads.experiments.driver.folders import owned, resume_option
from blindheads.experiments.driver.identity import claim_all, summary_identity
from blindheads.signals import Interrupted

# glibc hands the pages of a large freed tensor back and faults them in again at the next one: a quarter of an
# evaluation's time went to the kernel. Kept at the heap's top they are reused (a variable the user set wins).
KEEP_FREED_MEMORY = {"MALLOC_TRIM_THRESHOLD_": str(16 << 30), "MALLOC_TOP_PAD_": str(1 << 30)}


class JobFailed(RuntimeError):
    """A ``blindheads`` job of the experiment exited with an error (not because the driver was signalled)."""


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

    def stop(self, signum: int) -> None:
        """Pass ``signum`` on to every live job, as a signal to the driver would, and wait until each has ended
        (having saved ``last.ckpt``), leaving its exit status to ``launch``: what a launcher's job does when the
        scheduler warns it of a pre-emption or its time limit (``launchers``)."""
        self._forward(signum, None)
        with self._lock:
            live = [job.pid for job in self._live]
        for pid in live:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # not reaped: ``launch``'s ``wait`` still is

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
