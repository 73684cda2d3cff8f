"""Callbacks the tests add to real runs (in-process, or by class path ``support.callbacks.NAME`` in a CLI subprocess)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning as L
import torch


class KillAtStep(L.Callback):
    """SIGKILLs the whole process group (every DDP rank) once ``step`` optimiser steps are done."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            os.killpg(os.getpgid(0), signal.SIGKILL)


class KillRankZeroAtStep(L.Callback):
    """SIGKILLs rank 0 alone (as the OOM killer would) once ``step`` optimiser steps are done."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)


class PoisonAtStep(L.Callback):
    """Makes one weight NaN once ``step`` steps are done, so the next loss is not finite."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.decoder.embed.weight[0, 0] = float("nan")


class PoisonGradientAtStep(L.Callback):
    """Makes one gradient NaN at step ``step`` (the loss stays finite) and keeps a copy of the weights before it."""

    def __init__(self, step: int) -> None:
        self.step, self.before = step, None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step == self.step:
            pl_module.decoder.embed.weight.grad[0, 0] = float("nan")
            self.before = {k: v.clone() for k, v in pl_module.state_dict().items()}


class SignalAtStep(L.Callback):
    """Sends ``signum`` to the whole process group (as a terminal's Ctrl-C or SLURM would) once ``step`` steps are
    done, once."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum, self.sent = step, signum, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step and not self.sent:
            self.sent = True
            os.killpg(os.getpgid(0), self.signum)


class SignalInSanityCheck(L.Callback):
    """Sends ``signum`` to the whole process group during the sanity check (validation before the first step), once."""

    def __init__(self, signum: int) -> None:
        self.signum, self.sent = signum, False

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking and not self.sent:
            self.sent = True
            os.killpg(os.getpgid(0), self.signum)


class DiskFullAtStep(L.Callback):
    """From step ``step`` on, writing ``last.ckpt`` fails as on a full disk: its staging file is made a link to
    ``/dev/full`` (every write there fails with ENOSPC). Checkpoint callbacks run after this one."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            directory = trainer.checkpoint_callback.dirpath
            os.symlink("/dev/full", os.path.join(directory, f".last.ckpt.partial-{os.getpid()}"))


class SlowSteps(L.Callback):
    """Steps slow enough to be warned mid-fit: from step 3 on, 0.3 s each; ``reached`` written at step 3."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= 3:
            (Path(trainer.log_dir) / "reached").touch()
            time.sleep(0.3)
