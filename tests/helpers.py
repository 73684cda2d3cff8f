"""Callbacks the tests add to real runs."""

from __future__ import annotations

import os
import signal

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
