"""Ctrl-C, SIGTERM (what SLURM sends before a time limit or a pre-emption) and SIGHUP (the terminal was closed) end
training at the next step boundary with ``last.ckpt`` saved, and the process exits in one line with 128 + the
signal's number.

Lightning already turns SIGTERM into a stop at the end of the current step (rank 0's signal, broadcast to every
rank). From the sanity check on, SIGINT and SIGHUP are routed into the same path instead of raising
``KeyboardInterrupt`` or ending the process wherever the main thread happens to be (mid-step, mid-write). Outside
training (set-up, data preparation) there is no step to save, and a second signal asks not to wait: both stop at
once (``Interrupted``), in one line, with the same exit status. Data-loader workers ignore these signals (the data
module's ``worker_init_fn``): the main process shuts them down, so no worker prints a traceback.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

SIGNALS = (signal.SIGINT, signal.SIGHUP)  # routed here; SIGTERM is Lightning's, joined by SaveOnInterrupt


class Interrupted(BaseException):
    """A signal that stops the command at once (not an ``Exception``: nothing may catch and carry on)."""

    def __init__(self, signum: int, line: str) -> None:
        super().__init__(line)
        self.signum, self.line = signum, line


def _stop_at_once(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    raise Interrupted(signum, f"blindheads: stopped by {name} outside training steps: no step to save")


@contextmanager
def stopping_at_once():
    """While the command runs, SIGINT and SIGHUP stop it at once in one line (``SaveOnInterrupt`` makes them wait for
    the step's end while training runs); the previous handlers come back after it."""
    previous = {signum: signal.signal(signum, _stop_at_once) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def exit_after_interrupt(stop: BaseException) -> NoReturn:
    """Where the command stopped on a signal: print what was saved, exit with 128 + the signal's number."""
    signum = getattr(stop, "signum", signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM)
    line = getattr(stop, "line", None) or f"blindheads: stopped by {signal.Signals(signum).name}: no step to save"
    print(line, file=sys.stderr, flush=True)
    sys.exit(128 + int(signum))


class SaveOnInterrupt(L.Callback):
    """Saves ``last.ckpt`` (atomically, through the trainer's checkpoint I/O) when ``fit`` stops on a signal."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.first_step: int | None = None  # the step this run started from: no newer state before it

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_at_step_end(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_at_step_end(trainer)

    def _stop_at_step_end(self, trainer: L.Trainer) -> None:
        """Lightning's own SIGTERM handler is in place by the sanity check (or the first step, without one), and it
        restores the previous handlers at teardown."""
        if self.first_step is not None:
            return
        self.first_step = trainer.global_step
        for signum in SIGNALS:
            signal.signal(signum, lambda signum, frame: self._stop(trainer, signum))
        terminate = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame) -> None:
            self.signum = self.signum or signum
            if callable(terminate):
                terminate(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # a second signal: stop now
            raise Interrupted(
                signum, f"blindheads: a second {name} at step {trainer.global_step}: stopped at once, nothing saved"
            )
        self.signum = signum
        trainer._signal_connector.received_sigterm = True  # Lightning stops at the end of the current step

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Saves the stopped step and tells the command's exit what to print (on the exception it re-raises)."""
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        # signum and line: attributes of our own on Lightning's exception, read back by exit_after_interrupt
        exception.signum = signum = self.signum or signal.SIGTERM  # type: ignore[attr-defined]
        where = f"blindheads: {signal.Signals(signum).name} at step {trainer.global_step}"
        checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
        if trainer.global_step == self.first_step:
            line = f"{where}, before this run's first step: nothing new to save"
        elif checkpoint is None or not checkpoint.dirpath:
            line = f"{where}: this run writes no checkpoints, nothing was saved"
        else:
            path = Path(checkpoint.dirpath) / "last.ckpt"
            trainer.save_checkpoint(path)
            line = f"{where}: saved {path}; resume with --ckpt_path last"
        exception.line = line  # type: ignore[attr-defined]
