"""A fit that starts from another run's decoder weights: what makes recall learnable at a 256-token window on a laptop,
where a decoder from scratch does not learn it in hundreds of steps."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.cli import SaveConfigCallback

from blindheads.checkpoints.reading import load_checkpoint
from blindheads.checkpoints.rebuild import decoder_config, decoder_state
from blindheads.modules.config import DecoderConfig
from blindheads.modules.lm import DecoderLM
from blindheads.running import running

POSITION = "position."  # the position stack's keys: always the run's own


class WarmStart(L.Callback):
    """Start a fit from another checkpoint's weights (weights only).

    At the start of a fit that does not resume, the decoder's weights are those of checkpoint ``ckpt_path``
    (weights only: its optimizer state, step, schedule and data position are not taken, so the fit's own schedule
    starts at step 0). ``{seed}`` in the path is the run's seed (``run_seed``), so each seed of a grid starts from
    its own; a run that sets no seed (``--seed_everything false``) is refused one, whatever ``PL_GLOBAL_SEED``
    another run left in the environment.

    Every weight of the decoder must be in the checkpoint with the same shape, except the position stack's, which
    are always the run's own (slopes from its config: a NoPE or log-distance run can start from an ALiBi one), and
    finite; the checkpoint's config must split attention into the same heads (``num_heads``, their size and
    ``num_kv_heads``: 2 heads of 16 and 4 of 8 hold weights of one shape, read differently). A mismatch is refused
    in one line before the first step. A fit resumed with ``--ckpt_path`` takes its own checkpoint's weights instead.
    Where the weights came from (path, step, the file's sha256) is kept in the run's checkpoints and in
    ``results.json`` (``warm_start``).
    """

    def __init__(self, ckpt_path: str | None = None) -> None:
        if not ckpt_path:
            raise ValueError("callbacks.warm_start needs ckpt_path: the checkpoint whose decoder weights start the fit")
        self.ckpt_path = ckpt_path
        self.started_from: dict = {}

    def resolved(self, trainer: L.Trainer) -> Path:
        """The checkpoint this run starts from: ``{seed}`` replaced by the run's seed (``run_seed``)."""
        seed = run_seed(trainer)
        if "{seed}" in self.ckpt_path and seed is None:
            raise ValueError(f"callbacks.warm_start.ckpt_path {self.ckpt_path} names {{seed}}, but this run sets no "
                             "seed: give --seed_everything N")  # fmt: skip
        return Path(self.ckpt_path.replace("{seed}", str(seed)))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None:  # resumed: the run's own checkpoint already restored its weights
            return
        path = self.resolved(trainer)
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
        check_head_layout(decoder_config(checkpoint, path), pl_module.config, path)
        broken = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if broken:
            more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
            raise ValueError(f"callbacks.warm_start: {path} holds nan or inf weights ({', '.join(broken[:3])}{more}); "
                             "start from a checkpoint saved before its run diverged")  # fmt: skip
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


def run_seed(trainer: L.Trainer) -> int | None:
    """The seed this run set: its config's ``seed_everything`` (LightningCLI records the seed it drew for ``true``;
    ``false``: none). ``PL_GLOBAL_SEED`` only for a trainer built in Python, which has no config: there it is the
    one record of ``seed_everything``, while a CLI run that sets no seed may inherit one from another run."""
    record = next((c for c in running(trainer).callbacks if isinstance(c, SaveConfigCallback)), None)
    if record is None:
        seed = os.environ.get("PL_GLOBAL_SEED")
        return None if seed is None else int(seed)
    seed = record.config.get("seed_everything")
    return None if seed is None or isinstance(seed, bool) else int(seed)


def head_layout(config: DecoderConfig) -> str:
    """How a config splits attention into heads, in words."""
    return f"{config.num_heads} heads of size {config.head_size}, {config.num_kv_heads} key/value heads"


def check_head_layout(theirs: DecoderConfig, ours: DecoderConfig, path: Path) -> None:
    """The checkpoint's attention split into the heads this model's is: with the same widths, 2 heads of 16 and 4
    of 8 hold weights of one shape, but each head would read other rows of them."""
    if head_layout(theirs) != head_layout(ours):
        raise ValueError(
            f"callbacks.warm_start: {path} has {head_layout(theirs)}, this model {head_layout(ours)}: its attention "
            "weights would be read as other heads; start from a run of the same heads"
        )
