"""When the evaluation callbacks run."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.figure import Figure

from blindheads.modules.lm import DecoderLM
from blindheads.numerics import PRECISION_DTYPES, resolve_dtype
from blindheads.running import running


class PeriodicEvaluation(L.Callback):
    """Runs ``evaluate`` every ``every_n_steps`` training steps (``None``: never during fit), after ``validate``
    (metrics prefixed ``val/``) and after ``test`` (``test/``, which reach the results file). Every rank calls it at
    the same moments, so evaluations that reduce across ranks stay in step."""

    def __init__(self, every_n_steps: int | None = 500) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._seen_step: int | None = None

    def evaluate(self, trainer: L.Trainer, pl_module: DecoderLM, prefix: str = ""):
        raise NotImplementedError

    def on_train_start(self, trainer, pl_module) -> None:
        self._seen_step = trainer.global_step  # a resumed run starts at its checkpoint's step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Once per optimizer step: with gradient accumulation, several batches end at the same global step."""
        if trainer.global_step == self._seen_step:
            return
        self._seen_step = trainer.global_step
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self.evaluate(trainer, pl_module)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "validate":
            self._named(trainer, pl_module, "validate", "val/")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._named(trainer, pl_module, "test", "test/")

    def _named(self, trainer: L.Trainer, pl_module: DecoderLM, command: str, prefix: str) -> None:
        """``evaluate`` after ``validate``/``test``, with a line naming it and, once done, its time: an evaluation can
        take minutes, and nothing else is printed meanwhile. (During fit the progress lines name evaluation time.)"""
        start = time.monotonic()
        if trainer.is_global_zero:
            print(f"{command}: {type(self).__name__} ...", end="", flush=True)
        self.evaluate(trainer, pl_module, prefix=prefix)
        if trainer.is_global_zero:
            print(f" {time.monotonic() - start:.0f} s", flush=True)


def training_length(trainer: L.Trainer, pl_module: DecoderLM) -> int:
    """The sequence length the model trains on (the data module's), else its context length."""
    length = getattr(running(trainer).datamodule, "seq_len", None) or pl_module.config.context_length
    assert length is not None  # DecoderConfig fills context_length
    return length


def scaled_lengths(base: int, factors: list[float]) -> list[int]:
    """The evaluation lengths ``factors`` x the training length ``base``, rounded, distinct, ascending."""
    return sorted({round(f * base) for f in factors})


def autocast_dtype(trainer: L.Trainer) -> torch.dtype:
    """The dtype attention computes in under the trainer's precision (``bf16-mixed`` -> bfloat16, ...)."""
    return resolve_dtype(PRECISION_DTYPES.get(str(trainer.precision), "float32"))


def per_head(scalars: dict[str, float], tag: Callable[[int], str], values: torch.Tensor) -> None:
    """``tag(h)`` for each head h's finite value (TensorBoard and JSON take no infinities)."""
    for head, value in enumerate(values.tolist()):
        if math.isfinite(value):
            scalars[tag(head)] = value


def evaluated_step(trainer: L.Trainer, pl_module: L.LightningModule) -> int:
    """The training step the evaluated weights come from: the checkpoint's under validate/test."""
    step = getattr(pl_module, "checkpoint_step", None)
    return step if step is not None and trainer.state.fn in ("validate", "test") else trainer.global_step


def log_figures(trainer: L.Trainer, pl_module: L.LightningModule, figures: dict[str, Callable[[int], Figure]]) -> None:
    """``{tag: build(step)}`` to TensorBoard at the evaluated step, on rank 0; built only where they are written."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger) and trainer.is_global_zero:
            step = evaluated_step(trainer, pl_module)
            for tag, build in figures.items():
                logger.experiment.add_figure(tag, build(step), step)


def log_scalars(trainer: L.Trainer, pl_module: L.LightningModule, scalars: dict[str, float], prefix: str) -> None:
    """During fit, write once to the loggers at this step (``self.log`` from a batch hook would repeat the value
    at every later step); after ``validate``/``test``, log through the module so the values reach the results."""
    if prefix:
        pl_module.log_dict(scalars, sync_dist=False, rank_zero_only=True)
    elif trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=trainer.global_step)
