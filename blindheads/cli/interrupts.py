"""Ctrl-C and SIGTERM (what SLURM sends before a time limit or a pre-emption) end training at the next step boundary
with ``last.ckpt`` saved, and the process exits in one line with 128 + the signal's number.

Lightning already turns SIGTERM into a stop at the end of the current step (rank 0's signal, broadcast to every
rank). SIGINT is routed into the same path instead of raising ``KeyboardInterrupt`` wherever the main thread happens
to be (mid-step, mid-write); a second Ctrl-C interrupts at once. Data-loader workers ignore both signals (the data
module's ``worker_init_fn``): the main process shuts them down, so no worker prints a traceback.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

STOPPED: dict[str, object] = {}  # the signal and the line to print, for the command's exit


def exit_after_interrupt() -> None:
    """Where ``fit`` stopped on a signal: print what was saved, exit with 128 + the signal's number."""
    signum = STOPPED.get("signum", signal.SIGTERM)
    print(STOPPED.get("line", f"blindheads: stopped by {signal.Signals(signum).name}"), file=sys.stderr, flush=True)
    sys.exit(128 + int(signum))


class SaveOnInterrupt(L.Callback):
    """Saves ``last.ckpt`` (atomically, through the trainer's checkpoint I/O) when ``fit`` stops on a signal."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, lambda signum, frame: self._stop(trainer, signum))
        terminate = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame) -> None:
            self.signum = self.signum or signum
            if callable(terminate):
                terminate(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        if self.signum is not None:  # a second Ctrl-C: stop now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.signum = signum
        trainer._signal_connector.received_sigterm = True  # Lightning stops at the end of the current step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        signum = self.signum or signal.SIGTERM
        STOPPED["signum"] = signum
        checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
        where = f"blindheads: {signal.Signals(signum).name} at step {trainer.global_step}"
        if checkpoint is None or not checkpoint.dirpath:
            STOPPED["line"] = f"{where}: this run writes no checkpoints, nothing was saved"
            return
        path = Path(checkpoint.dirpath) / "last.ckpt"
        trainer.save_checkpoint(path)
        STOPPED["line"] = f"{where}: saved {path}; resume with --ckpt_path last"
