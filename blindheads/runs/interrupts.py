"""Ctrl-C, SIGTERM (what SLURM sends before a time limit or a pre-emption) and SIGHUP (the terminal was closed) end
training at the next step boundary with ``last.ckpt`` saved, and the process exits in one line with 128 + the
signal's number (``blindheads.signals``).

Lightning already turns SIGTERM into a stop at the end of the current step (rank 0's signal, broadcast to every
rank). From the sanity check on, SIGINT and SIGHUP join the same path: each is passed on as a SIGTERM of this
process, instead of raising ``KeyboardInterrupt`` or ending the process wherever the main thread happens to be
(mid-step, mid-write). Outside training (set-up, data preparation) there is no step to save, and a second signal asks
not to wait: both stop at once (``Interrupted``), in one line, with the same exit status. Data-loader workers ignore
these signals (``signals.ignore_stops``): the main process shuts them down, so no worker prints a traceback.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blindheads.running import running
from blindheads.signals import Interrupted, handling

SIGNALS = (signal.SIGINT, signal.SIGHUP)  # routed here; SIGTERM is Lightning's, joined by SaveOnInterrupt


def _stop_at_once(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    raise Interrupted(signum, f"blindheads: stopped by {name} outside training steps: no step to save")


@contextmanager
def stopping_at_once() -> Iterator[None]:
    """While the command runs, SIGINT and SIGHUP stop it at once in one line (``SaveOnInterrupt`` makes them wait for
    the step's end while training runs); the previous handlers come back after it."""
    with handling(SIGNALS, _stop_at_once):
        yield


class SaveOnInterrupt(L.Callback):
    """Saves ``last.ckpt`` (atomically, through the trainer's checkpoint I/O) when ``fit`` stops on a signal, and
    keeps what the command says on its way out (``stopped``)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.first_step: int | None = None  # the step this run started from: no newer state before it
        self.stopped: Interrupted | None = None  # the signal and line of a fit that stopped on one
        self._before: dict = {}  # the SIGINT and SIGHUP handlers before training (``stopping_at_once``'s)

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
        self._before = {
            signum: signal.signal(signum, lambda signum, frame: self._stop(trainer, signum)) for signum in SIGNALS
        }
        terminate = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame) -> None:
            self.signum = self.signum or signum
            if callable(terminate):
                terminate(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Training is over: SIGINT and SIGHUP stop the command at once again."""
        for signum, handler in self._before.items():
            signal.signal(signum, handler)
        self._before = {}

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # a second signal: stop now
            raise Interrupted(
                signum, f"blindheads: a second {name} at step {trainer.global_step}: stopped at once, nothing saved"
            )
        self.signum = signum
        signal.raise_signal(signal.SIGTERM)  # Lightning's stop: at the end of the current step, on every rank

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Saves the stopped step and keeps the line the command exits with."""
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        signum = self.signum or signal.SIGTERM
        where = f"blindheads: {signal.Signals(signum).name} at step {trainer.global_step}"
        checkpoint = next((c for c in running(trainer).callbacks if isinstance(c, ModelCheckpoint)), None)
        if trainer.global_step == self.first_step:
            line = f"{where}, before this run's first step: nothing new to save"
        elif checkpoint is None or not checkpoint.dirpath:
            line = f"{where}: this run writes no checkpoints, nothing was saved"
        else:
            path = Path(checkpoint.dirpath) / "last.ckpt"
            trainer.save_checkpoint(path)
            line = f"{where}: saved {path}; resume with --ckpt_path last"
        self.stopped = Interrupted(signum, line)
