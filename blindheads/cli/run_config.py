"""A run directory's config records: ``config.yaml`` is the fit that made the run, and is never rewritten by what
comes after it. A resumed fit writes ``config.resume-STEP.yaml`` (STEP: the checkpoint's training step;
``config.resume.yaml`` from a remote checkpoint), ``validate`` and ``test`` write ``config.validate.yaml`` and
``config.test.yaml``, each beside it, and the options in which they differ from ``config.yaml`` are logged in one
line. A command that finds no ``config.yaml`` made the directory, and writes it; a fit from scratch remakes the run,
and rewrites it."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.trainer.states import TrainerFn

from blindheads.checkpoints import recorded_step
from blindheads.cli.checkpoint_options import flatten

log = logging.getLogger(__name__)
RECORD = "config.yaml"
NOT_COMPARED = ("ckpt_path",)  # what makes a run one from a checkpoint, not a difference in how it runs


class RunConfig(SaveConfigCallback):
    """LightningCLI's config saving, into the file ``record_name`` picks rather than always ``config.yaml``."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved:
            log_dir = trainer.log_dir  # a collective under DDP: read on every rank, here
            assert log_dir is not None  # the first logger's directory, else the trainer's default root
            self.log_dir = Path(log_dir)
            self.config_filename = record_name(self.log_dir, TrainerFn(stage).value, self.config.get("ckpt_path"))
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Rank 0, once the record is written: what it changes from the run's ``config.yaml``."""
        if self.config_filename == RECORD:
            return
        recorded, used = (flatten(_read(self.log_dir / name), "") for name in (RECORD, self.config_filename))
        changed = [
            f"{key} {recorded[key]!r} -> {used[key]!r}"
            for key in sorted(recorded.keys() & used.keys())
            if recorded[key] != used[key] and key not in NOT_COMPARED
        ]
        if changed:
            first = self.log_dir / RECORD
            log.warning(
                f"{self.config_filename} differs from {first} (the run's first record, kept as it was) in: "
                + "; ".join(changed)
            )


def record_name(log_dir: Path, stage: str, ckpt_path: str | None) -> str:
    """The file this command's config goes to in ``log_dir`` (see the module's docstring)."""
    if not (log_dir / RECORD).is_file() or (stage == "fit" and ckpt_path is None):
        return RECORD
    if stage == "fit" and ckpt_path is not None:  # not None: returned above
        step = recorded_step(Path(ckpt_path))  # None for a remote checkpoint
        return "config.resume.yaml" if step is None else f"config.resume-{step}.yaml"
    return f"config.{stage}.yaml"


def _read(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}
