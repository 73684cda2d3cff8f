"""Checkpoints that are never half written."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from blindheads.cli.disk_full import DiskFull, no_space


def not_a_checkpoint(path, error: BaseException) -> str:
    """One line for a file that cannot be a checkpoint, naming it and why (never torch's ``weights_only`` advice)."""
    reasons = {
        EOFError: "empty or truncated",
        pickle.UnpicklingError: "not a PyTorch checkpoint file",
        KeyError: "no Lightning checkpoint inside",
        zipfile.BadZipFile: "not a PyTorch checkpoint file",
    }
    reason = next((text for kind, text in reasons.items() if isinstance(error, kind)), type(error).__name__)
    return f"not a blindheads checkpoint: {path} ({reason})"


def process_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a local checkpoint to a temporary file beside it, syncs it, then renames it into place: a run killed
    mid-write, or out of disk space, leaves the previous checkpoint intact (a full disk ends the run in one line,
    ``DiskFull``), and the next save removes what such a run left. Remote paths go through Lightning's own writer.
    Loading a file that is no checkpoint fails in one line."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for debris in path.parent.glob(".*.partial-*"):  # left by runs killed mid-write
            pid = debris.name.rpartition("-")[2]
            if pid.isdigit() and not process_alive(int(pid)):
                debris.unlink(missing_ok=True)
        staging = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            with open(staging, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(staging, path)
        except Exception as error:
            if no_space(error) is None:
                raise
            raise DiskFull(path, path.parent) from None
        finally:
            staging.unlink(missing_ok=True)

    def load_checkpoint(self, path, map_location: Any = None, **kwargs: Any) -> dict[str, Any]:
        try:
            checkpoint = super().load_checkpoint(path, map_location=map_location, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as error:
            raise ValueError(not_a_checkpoint(path, error)) from None
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise ValueError(not_a_checkpoint(path, KeyError("state_dict")))
        return checkpoint
