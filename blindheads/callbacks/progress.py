"""A progress line every few steps, readable in a terminal and in a log file alike (no bar, no carriage returns)."""

from __future__ import annotations

import time

import lightning as L


class ProgressLines(L.Callback):
    """Every ``every_n_steps`` optimizer steps, on rank 0: ``step 100/300  loss 4.512  1.2 s/step  eta 4 min``."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._since: tuple[int, float] | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._since = (trainer.global_step, time.monotonic())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or step % self.every_n_steps or step == self._since[0]:
            return
        seconds = (time.monotonic() - self._since[1]) / (step - self._since[0])
        self._since = (step, time.monotonic())
        loss = trainer.callback_metrics.get("train/loss")
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        parts = [f"step {step}/{total}" if total else f"step {step}"]
        if loss is not None:
            parts.append(f"loss {float(loss):.3f}")
        parts.append(f"{seconds:.2f} s/step")
        if total:
            parts.append(f"eta {(total - step) * seconds / 60:.1f} min")
        print("  ".join(parts), flush=True)
