"""Which ``last.ckpt`` a resumed run goes on writing (which checkpoint files are whole, and which one
``--ckpt_path last`` resumes from: ``blindheads.checkpoints``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class KeepWritingLast(L.Callback):
    """A resumed fit goes on writing its directory's ``last.ckpt``. ModelCheckpoint forgets which file it wrote
    last when the checkpoint was saved in another directory (a run copied with ``cp -r``), then writes
    ``last-v1.ckpt`` beside the ``last.ckpt`` it resumed from, leaving that one stale."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is None:
            return
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or not (callback.save_last and callback.dirpath):
                continue
            if Path(callback.last_model_path).parent != Path(callback.dirpath):
                callback.last_model_path = callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
