"""Progress by optimizer step: a line every few steps, readable in a terminal and in a log file alike (no bar, no
carriage returns), and the bar Lightning shows by default counting steps rather than epochs."""

from __future__ import annotations

import statistics
import time

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

from blindheads.evaluation.tags import loss_tag


class ProgressLines(L.Callback):
    """One progress line every ``every_n_steps`` optimizer steps: loss, seconds a step and an ETA.

    Every ``every_n_steps`` optimizer steps, on rank 0: ``step 100/300  loss 4.512  1.20 s/step  eta 4.0 min``,
    and ``+ 31 s evaluating`` where the periodic evaluations took time since the last line. A step's time is the
    median of the steps since the last line, so an evaluation (a few long steps) moves neither it nor the ETA."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._since: tuple[int, float] | None = None  # the last line's step and time
        self._last: tuple[int, float] | None = None  # the last step seen starting, and when
        self._steps: list[float] = []  # seconds of each step since the last line

    def on_train_start(self, trainer, pl_module) -> None:
        self._since = self._last = (trainer.global_step, time.monotonic())
        self._steps = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._tick(trainer.global_step)

    def _tick(self, step: int) -> None:
        now = time.monotonic()
        if self._last is not None and step > self._last[0]:  # accumulated batches: one step, many batches
            self._steps += [(now - self._last[1]) / (step - self._last[0])] * (step - self._last[0])
            self._last = (step, now)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or step % self.every_n_steps:
            return
        assert self._since is not None  # set in on_train_start
        if step == self._since[0]:
            return
        self._tick(step)  # this step's time up to here: its optimizer step done, any evaluation after it not yet
        elapsed = time.monotonic() - self._since[1]
        seconds = statistics.median(self._steps) if self._steps else elapsed / (step - self._since[0])
        evaluating = elapsed - seconds * (step - self._since[0])
        self._since, self._steps = (step, time.monotonic()), []
        loss = trainer.callback_metrics.get(loss_tag("train/"))
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        parts = [f"step {step}/{total}" if total else f"step {step}"]
        if loss is not None:
            parts.append(f"loss {float(loss):.3f}")
        parts.append(f"{seconds:.2f} s/step")
        if total:
            parts.append(f"eta {(total - step) * seconds / 60:.1f} min")
        if evaluating >= max(1.0, 0.1 * elapsed):  # not the steps' own spread
            parts.append(f"+ {evaluating:.0f} s evaluating")
        print("  ".join(parts), flush=True)


class StepProgressBar(TQDMProgressBar):
    """Lightning's bar describes training by epochs: a run bounded by ``max_steps`` on a stream has ``max_epochs``
    -1, which Rich's bar shows as ``Epoch 0/-2``. Under a step budget this one counts optimizer steps, from the
    step a resumed run starts at: ``step:  40%|####      | 120/300``."""

    def on_train_start(self, trainer, *args) -> None:
        super().on_train_start(trainer, *args)
        if trainer.max_steps > 0:  # a run resumed mid-epoch starts no epoch
            self._count_steps(trainer)

    def on_train_epoch_start(self, trainer, *args) -> None:
        if trainer.max_steps <= 0:
            return super().on_train_epoch_start(trainer, *args)
        self._count_steps(trainer)

    def _count_steps(self, trainer) -> None:
        bar = self.train_progress_bar
        bar.set_description("step", refresh=False)
        bar.reset(total=trainer.max_steps)
        bar.initial = bar.n = trainer.global_step
        bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps <= 0:
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        bar = self.train_progress_bar
        if not bar.disable and self._should_update(trainer.global_step, trainer.max_steps):
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar


def shows_a_progress_bar(trainer_options, configured: list) -> bool:
    """Whether a Trainer of these options and ``configured`` callbacks would add Lightning's default bar (Rich's
    where rich is installed, else tqdm's): it shows a bar and none is configured. ``StepProgressBar`` goes in its
    place."""
    return trainer_options.get("enable_progress_bar", True) is not False and not any(
        isinstance(callback, ProgressBar) for callback in configured
    )
