"""A run directory's config records: ``config.yaml`` is the fit that made the run, and is never rewritten by what
comes after it. A resumed fit writes ``config.resume-STEP.yaml`` (STEP: the checkpoint's training step;
``config.resume.yaml`` from a remote checkpoint), ``validate`` and ``test`` write ``config.validate.yaml`` and
``config.test.yaml``, each beside it, and the options in which they differ from ``config.yaml`` are logged in one
line. A command that finds no ``config.yaml`` made the directory, and writes it.

A fit from scratch (no ``--ckpt_path``) into a directory that already holds a run is refused, naming the options
that differ from its ``config.yaml``, when they differ or when the run saved checkpoints: two runs in one folder
would mix their records, checkpoints (``last-v1.ckpt`` beside ``last.ckpt``) and TensorBoard curves, and ``--ckpt_path
last`` would find the other model. Only a run that saved no checkpoint, asked again with the same options (a grid's
run killed before its first save), starts over there, rewriting ``config.yaml``."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.trainer.states import TrainerFn

from blindheads.checkpoints.options import flatten
from blindheads.checkpoints.reading import recorded_step

log = logging.getLogger(__name__)
RECORD = "config.yaml"
NOT_COMPARED = ("ckpt_path",)  # what makes a run one from a checkpoint, not a difference in how it runs
WHERE = tuple(
    f"trainer.logger.init_args.{key} " for key in ("save_dir", "name", "version")
)  # the folder itself  # what makes a run one from a checkpoint, not a difference in how it runs


class RunConfig(SaveConfigCallback):
    """LightningCLI's config saving, into the file ``record_name`` picks rather than always ``config.yaml``."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved:
            log_dir = trainer.log_dir  # a collective under DDP: read on every rank, here
            assert log_dir is not None  # the first logger's directory, else the trainer's default root
            self.log_dir = Path(log_dir)
            self.config_filename = record_name(self.log_dir, TrainerFn(stage).value, self.config.get("ckpt_path"))
        super().setup(trainer, pl_module, stage)

    def refuse_a_second_run(self, log_dir: Path) -> None:
        """Refuse a fit from scratch into ``log_dir`` where it holds another run (see the module's docstring); called
        before the fit starts, as Lightning's set-up opens the loggers' files."""
        first, saved = log_dir / RECORD, sorted(p.name for p in (log_dir / "checkpoints").glob("*.ckpt"))
        if not first.is_file() and not saved:
            return
        used = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        changed = [
            change
            for change in changes(flatten(_read(first), "") if first.is_file() else {}, flatten(used, ""))
            if not change.startswith(WHERE)  # a copied run's folder moved: where it is, not what it is
        ]
        if not changed and not saved:
            return
        more = f"; and {len(changed) - 4} more" if len(changed) > 4 else ""
        held = (
            f"a run with other options ({'; '.join(changed[:4])}{more})"
            if changed
            else f"a run that saved {', '.join(saved)}"
        )
        raise ValueError(
            f"{log_dir} already holds {held}: a fit without --ckpt_path would mix two runs in one folder; give "
            "this run another --trainer.logger.init_args.version (or remove the folder), or resume the run there "
            "with --ckpt_path last"
        )

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Rank 0, once the record is written: what it changes from the run's ``config.yaml``."""
        if self.config_filename == RECORD:
            return
        recorded, used = (flatten(_read(self.log_dir / name), "") for name in (RECORD, self.config_filename))
        changed = changes(recorded, used)
        if changed:
            first = self.log_dir / RECORD
            log.warning(
                f"{self.config_filename} differs from {first} (the run's first record, kept as it was) in: "
                + "; ".join(changed)
            )


def changes(recorded: dict, used: dict) -> list[str]:
    """The options (flattened) whose value differs between two config records, ``key 'then' -> 'now'``."""
    return [
        f"{key} {recorded[key]!r} -> {used[key]!r}"
        for key in sorted(recorded.keys() & used.keys())
        if recorded[key] != used[key] and key not in NOT_COMPARED
    ]


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
