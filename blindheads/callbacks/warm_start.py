"""A fit that starts from another run's decoder weights: what makes recall learnable at a 256-token window on a laptop,
where a decoder from scratch does not learn it in hundreds of steps."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import lightning as L
import torch

from blindheads.checkpoints.reading import load_checkpoint
from blindheads.checkpoints.rebuild import decoder_state
from blindheads.modules.lm import DecoderLM

POSITION = "position."  # the position stack's keys: always the run's own


class WarmStart(L.Callback):
    """Start a fit from another checkpoint's weights (weights only).

    At the start of a fit that does not resume, the decoder's weights are those of checkpoint ``ckpt_path``
    (weights only: its optimizer state, step, schedule and data position are not taken, so the fit's own schedule
    starts at step 0). ``{seed}`` in the path is the run's seed, so each seed of a grid starts from its own.

    Every weight of the decoder must be in the checkpoint with the same shape, except the position stack's, which
    are always the run's own (slopes from its config: a NoPE or log-distance run can start from an ALiBi one); a
    mismatch is refused in one line before the first step. A fit resumed with ``--ckpt_path`` takes its own
    checkpoint's weights instead. Where the weights came from (path, step, the file's sha256) is kept in the run's
    checkpoints and in ``results.json`` (``warm_start``).
    """

    def __init__(self, ckpt_path: str | None = None) -> None:
        if not ckpt_path:
            raise ValueError("callbacks.warm_start needs ckpt_path: the checkpoint whose decoder weights start the fit")
        self.ckpt_path = ckpt_path
        self.started_from: dict = {}

    def resolved(self) -> Path:
        """The checkpoint this run starts from: ``{seed}`` replaced by the run's seed (``seed_everything``)."""
        seed = os.environ.get("PL_GLOBAL_SEED")
        if "{seed}" in self.ckpt_path and seed is None:
            raise ValueError(f"callbacks.warm_start.ckpt_path {self.ckpt_path} names {{seed}}, but no seed is set: "
                             "set seed_everything")  # fmt: skip
        return Path(self.ckpt_path.replace("{seed}", seed or ""))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None:  # resumed: the run's own checkpoint already restored its weights
            return
        path = self.resolved()
        checkpoint = load_checkpoint(path)
        state = {k: v for k, v in decoder_state(checkpoint).items() if not k.startswith(POSITION)}
        if not isinstance(pl_module, DecoderLM):
            raise TypeError(
                f"callbacks.warm_start loads a blindheads decoder's weights, not a {type(pl_module).__name__}'s"
            )
        decoder = pl_module.decoder
        own = {k: v for k, v in decoder.state_dict().items() if not k.startswith(POSITION)}
        missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
        shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
                  if k in state and state[k].shape != v.shape]  # fmt: skip
        if missing or unexpected or shapes:
            problem = (f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}" if unexpected
                       else f"shapes differ: {shapes[0]} here")  # fmt: skip
            raise ValueError(f"callbacks.warm_start: {path} does not fit this model ({problem}); start from a run of "
                             "the same shape")  # fmt: skip
        with torch.no_grad():
            for name, tensor in decoder.state_dict().items():
                if name in state:
                    tensor.copy_(state[name])
        self.started_from = {
            "ckpt_path": str(path),
            "global_step": checkpoint.get("global_step"),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
        if trainer.is_global_zero:
            print(
                f"warm start: decoder weights from {path} (step {self.started_from['global_step']}); its "
                "optimizer, step and data position are not taken, the position stack is this run's",
                flush=True,
            )

    def state_dict(self) -> dict:
        return dict(self.started_from)

    def load_state_dict(self, state_dict: dict) -> None:
        self.started_from = dict(state_dict)

    @property
    def results_fields(self) -> dict:
        """What ``ResultsFile`` adds to ``results.json``: where the weights started."""
        return {"warm_start": self.started_from} if self.started_from else {}
