"""The run-safety pieces a command hands to its Trainer, made once per command: the command keeps them, so what
they found (a run to discard, the line a signal left) is read after the Trainer is gone."""

from __future__ import annotations

import lightning as L

from blindheads.checkpoints.writing import AtomicCheckpointIO, KeepWritingLast
from blindheads.runs.interrupts import SaveOnInterrupt
from blindheads.runs.lock import RunLock


class RunSafety:
    """``RunLock`` (one live run per folder; a run refused before its first step removed), ``SaveOnInterrupt``
    (a signal saves at the step's end), ``KeepWritingLast`` (a resumed fit writes its own ``last.ckpt``) and
    ``AtomicCheckpointIO`` (checkpoints written whole). Each acts only where it applies: the lock and the saves in
    ``fit``."""

    def __init__(self) -> None:
        self.lock = RunLock()
        self.interrupts = SaveOnInterrupt()
        self.last = KeepWritingLast()
        self.io = AtomicCheckpointIO()

    def first_callbacks(self) -> list[L.Callback]:
        """Before every other callback: the lock is taken before anything writes into the run's folder."""
        return [self.lock]

    def last_callbacks(self) -> list[L.Callback]:
        return [self.interrupts, self.last]

    def after_run(self) -> None:
        """Once Lightning's own clean-up is over (its loggers write until then): a run refused before its first step
        leaves no run directory behind."""
        self.lock.remove_discarded()
