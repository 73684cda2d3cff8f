"""Checkpoints that are never half written, and the ``last.ckpt`` a resumed fit goes on writing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from blindheads.atomic import remove_debris, staging_path
from blindheads.checkpoints.reading import not_a_checkpoint, read_checkpoint, resume_advice
from blindheads.disk import DiskFull, no_space


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a local checkpoint to a temporary file beside it, syncs it, then renames it into place: a run killed
    mid-write, or out of disk space, leaves the previous checkpoint intact (a full disk ends the run in one line,
    ``DiskFull``), and the next save removes what such a run left. Remote paths go through Lightning's own writer.
    Loading a file that is no checkpoint, or one that would run code, fails in one line."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_debris(path.parent)  # left by runs killed mid-write
        staging = staging_path(path)
        try:
            with open(staging, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(staging, path)
        except Exception as error:
            if no_space(error) is None:
                raise
            raise DiskFull(path, resume_advice(path.parent)) from None
        finally:
            staging.unlink(missing_ok=True)

    def load_checkpoint(
        self, path, map_location: Any = None, weights_only: bool | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Tensors and plain data only, local or remote (``read_checkpoint``): a checkpoint from elsewhere is never
        code that runs (``weights_only`` is always true here, whatever is passed)."""
        if "://" in str(path):
            try:
                checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=True)
            except Exception as error:
                raise ValueError(not_a_checkpoint(path, error)) from None
        else:
            checkpoint = read_checkpoint(path, map_location)
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise ValueError(not_a_checkpoint(path, KeyError("state_dict")))
        return checkpoint


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
