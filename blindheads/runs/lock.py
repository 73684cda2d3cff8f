"""One live run per run directory: two fits with the same name and version would overwrite each other's checkpoints
and mix their ``config.yaml`` and ``hparams.yaml``."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import lightning as L

from blindheads import locks
from blindheads.locks import RUN_LOCK

log = logging.getLogger(__name__)


class RunLock(L.Callback):
    """Holds ``LOG_DIR/.blindheads.lock`` (the owner's PID) from setup to teardown. A lock whose process is gone
    (a crash, a kill) is taken over with a log line; one held by a live process stops this run before it writes."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.discard: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank reads it, rank 0 locks
        if stage != "fit" or not trainer.is_global_zero or log_dir is None:
            return
        path = Path(log_dir) / RUN_LOCK
        path.parent.mkdir(parents=True, exist_ok=True)
        locks.take(
            path,
            lambda owner: ValueError(f"run directory {log_dir} is in use by a live run (pid {owner}); give this run "
                                     "another --trainer.logger.init_args.version or name"),
            lambda owner: log.warning(f"taking over the lock of {log_dir} from pid {owner}, which is no longer running"),
        )  # fmt: skip
        self.path = path

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A failed run lets go of its directory; one that failed before its first step, in a directory that holds
        nothing but what this process wrote (a refused option, bad data), is removed once its loggers have closed."""
        if self.path is None:
            return
        directory = self.path.parent
        self.teardown(trainer, pl_module, "fit")
        if trainer.global_step == 0 and all(_written_here(p) for p in directory.rglob("*") if p.is_file()):
            self.discard = directory

    def remove_discarded(self) -> None:
        """Called after Lightning's own clean-up (its loggers write until then): ``RunSafety.after_run``."""
        if self.discard is not None:
            shutil.rmtree(self.discard, ignore_errors=True)
            if self.discard.parent.is_dir() and not any(self.discard.parent.iterdir()):
                self.discard.parent.rmdir()  # the logger's name folder, if this run was its only one
            self.discard = None


def _written_here(path: Path) -> bool:
    """The run's own files: the lock, its config records, TensorBoard event files named with this process's PID."""
    if path.name in (RUN_LOCK, "config.yaml", "hparams.yaml"):
        return True
    return path.name.startswith("events.out.tfevents.") and path.name.split(".")[-2] == str(os.getpid())
