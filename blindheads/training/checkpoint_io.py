"""Checkpoints that are never half written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a local checkpoint to a temporary file beside it, syncs it, then renames it into place: a run killed
    mid-write leaves the previous checkpoint intact. Remote paths go through Lightning's own writer."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            with open(staging, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(staging, path)
        finally:
            staging.unlink(missing_ok=True)
