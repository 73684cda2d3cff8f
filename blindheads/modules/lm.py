"""The LightningModule: a decoder trained with the causal LM loss and the SmolLM optimiser recipe."""

from __future__ import annotations

import math
from functools import partial

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from blindheads.modules.backends import Flex
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder
from blindheads.modules.schedules import SCHEDULES, lr_multiplier
from blindheads.running import running

DEAD_STEPS = 5  # consecutive steps with all-zero gradients that stop a run
VALID = {  # option -> (test, what the test accepts): beyond it a run trains to NaN or not at all
    "lr": (lambda v: 0 < v < math.inf, "a finite number > 0"),
    "betas": (lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    "eps": (lambda v: 0 < v < math.inf, "a finite number > 0"),
    "weight_decay": (lambda v: 0 <= v < math.inf, "a finite number >= 0"),
    "warmup_steps": (lambda v: v >= 0, "a step count >= 0"),
    "decay_fraction": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "min_lr_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}


def check_options(options: dict, prefix: str = "") -> None:
    """Refuse an optimiser or schedule value that cannot train, naming it: NaN, infinite (``1e400`` parses as
    infinity) or out of range. The CLI checks them as soon as they are parsed (``prefix`` ``--model.``); the module
    checks them again for Python users."""
    for name, (valid, accepted) in VALID.items():
        value = options.get(name)
        if value is not None and not valid(value):
            overflow = " (a number beyond 1.8e308 reads as inf)" if value in (math.inf, -math.inf) else ""
            raise ValueError(f"{prefix}{name} {value} is not {accepted}{overflow}")


class DecoderLM(L.LightningModule):
    """The model: a decoder trained on next-token prediction with AdamW and a warmup-then-decay schedule.

    The optimiser recipe is SmolLM's: AdamW (lr 3e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.01 on matrices) and a
    ``cosine`` or ``wsd`` schedule whose length is ``trainer.max_steps``. ``vocab_size`` is linked from the data
    module's tokenizer by the CLI.

    Args:
        decoder: The decoder's shape, position stack and numerics (the ``--model.decoder.*`` options).
        lr: Peak learning rate of AdamW, reached at the end of warmup.
        betas: AdamW's two moment decay rates, each in [0, 1).
        eps: AdamW's epsilon (added to the denominator).
        weight_decay: AdamW's decoupled weight decay, applied to matrices only (not to norms or biases).
        schedule: The learning-rate schedule after warmup: ``cosine`` (down to ``min_lr_ratio`` at
            ``trainer.max_steps``) or ``wsd`` (warmup-stable-decay: constant, then a ``1 - sqrt`` cooldown over the
            last ``decay_fraction`` of the steps).
        warmup_steps: Optimizer steps of linear warmup from 0 to ``lr``.
        decay_fraction: For ``wsd``: the fraction of ``trainer.max_steps`` spent cooling down, in [0, 1].
        min_lr_ratio: The final learning rate as a fraction of ``lr``, in [0, 1].
        compile: Compile each decoder block with ``torch.compile`` (not the LightningModule, whose logging breaks
            graphs).
    """

    # buffers, registered in __init__
    _first_nonfinite: Tensor
    _nonfinite_steps: Tensor
    _dead_steps: Tensor

    def __init__(
        self,
        decoder: DecoderConfig = DecoderConfig(),
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        schedule: str = "cosine",
        warmup_steps: int = 100,
        decay_fraction: float = 0.2,
        min_lr_ratio: float = 0.1,
        compile: bool = False,
    ) -> None:
        super().__init__()
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
        check_options(locals())  # the arguments, by name
        self.save_hyperparameters()
        self.decoder = Decoder(decoder)
        if compile:
            for i, block in enumerate(self.decoder.blocks):
                self.decoder.blocks[i] = torch.compile(block)  # type: ignore[assignment]  # a Module's compile is a Module (OptimizedModule)
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.tokens_seen = 0
        self._batch_shape: torch.Size | None = None
        self.checkpoint_step: int | None = None  # the training step of the loaded checkpoint (validate, test)
        self.register_buffer("_first_nonfinite", torch.tensor(-1), persistent=False)
        self.register_buffer("_nonfinite_steps", torch.tensor(0), persistent=False)
        self.register_buffer("_dead_steps", torch.tensor(0), persistent=False)  # consecutive all-zero gradients

    @property
    def config(self) -> DecoderConfig:
        return self.decoder.config

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.decoder(input_ids)

    def loss(self, windows: Tensor) -> Tensor:
        """Mean next-token cross-entropy of windows (batch, seq_len + 1)."""
        logits = self(windows[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten())

    # --- training ----------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        seq_len = getattr(datamodule, "seq_len", None)
        device = self.trainer.strategy.root_device
        if stage == "fit" and isinstance(self.decoder.backend_for(device), Flex) and device.type != "cuda":
            raise ValueError(
                f"attention=flex trains only on CUDA (PyTorch has no FlexAttention backward on "
                f"{device.type}); use attention=sdpa or auto"
            )
        if seq_len is not None and seq_len > self.config.context_length:
            raise ValueError(
                f"data.seq_len={seq_len} is longer than the model's context_length={self.config.context_length}: "
                "lower data.seq_len or raise model.decoder.context_length"
            )

    def training_step(self, windows: Tensor, batch_idx: int) -> Tensor:
        loss = self.loss(windows)
        self._step_loss = loss.detach()
        self._batch_shape = windows[:, 1:].shape
        self.tokens_seen += windows[:, 1:].numel() * self.trainer.world_size
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/ppl", loss.detach().exp())
        self.log("train/tokens", float(self.tokens_seen))
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    # --- non-finite steps: found on the device, skipped there, reported at the next host sync ------------------
    def on_before_optimizer_step(self, optimizer) -> None:
        """Flag a step whose loss or gradients are not finite. The fused AdamW reads ``found_inf`` (as it does from
        a ``GradScaler``) and skips the update on the device, so weights never take a non-finite step and no
        per-step host sync is needed; ``check_finite`` raises at the next logging boundary or checkpoint."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        self._grad_norm = norm  # clipping reuses it
        finite = torch.isfinite(self._step_loss) & torch.isfinite(norm)
        optimizer.found_inf = (~finite).float()
        self._dead_steps = torch.where(norm == 0, self._dead_steps + 1, torch.zeros_like(self._dead_steps))
        step = torch.full_like(self._first_nonfinite, self.global_step)
        self._first_nonfinite = torch.where(finite | (self._first_nonfinite >= 0), self._first_nonfinite, step)
        self._nonfinite_steps += (~finite).long()

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip here, with the norm ``on_before_optimizer_step`` took, not through Lightning's precision plugin: its
        mixed-precision plugin refuses any clipping with a fused optimizer (which unscales a ``GradScaler``'s
        gradients inside its step), although bf16 autocast scales nothing. float16 AMP does scale them, so clipping
        before the step would clip scaled gradients: it is refused."""
        if not gradient_clip_val:
            return
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            raise ValueError(
                "gradient clipping with 16-mixed precision would clip scaled gradients (the fused AdamW unscales them "
                "inside its step): use bf16-mixed, or set --trainer.gradient_clip_val null"
            )
        parameters = [p for p in self.parameters() if p.grad is not None]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(parameters, gradient_clip_val)
        else:
            torch.nn.utils.clip_grads_with_norm_(parameters, gradient_clip_val, self._grad_norm)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.global_step % running(self.trainer).log_every_n_steps == 0:
            self.check_finite()

    def on_train_end(self) -> None:
        self.check_finite()

    def check_finite(self) -> None:
        """Raise if any step since the start had a non-finite loss or gradient, or if the last
        ``DEAD_STEPS`` steps all had exactly zero gradients (one host sync)."""
        nonfinite, first, dead = torch.stack([self._nonfinite_steps, self._first_nonfinite, self._dead_steps]).tolist()
        if nonfinite:
            raise FloatingPointError(
                f"non-finite training loss or gradients at step {first} ({nonfinite} optimizer steps skipped by step "
                f"{self.global_step}); training stopped, the checkpoints written before are untouched"
            )
        if dead >= DEAD_STEPS:
            raise FloatingPointError(
                f"every gradient was exactly zero for the last {dead} steps (to step {self.global_step}): nothing "
                "trains (saturated softmax or norms, a zero learning signal); training stopped"
            )

    def validation_step(self, windows: Tensor, batch_idx: int) -> None:
        self.val_loss.update(self.loss(windows), weight=windows.shape[0])

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.log_dict({"val/loss": loss, "val/ppl": loss.exp()}, prog_bar=True, sync_dist=False)
        self.val_loss.reset()

    def test_step(self, windows: Tensor, batch_idx: int) -> None:
        self.test_loss.update(self.loss(windows), weight=windows.shape[0])

    def on_test_epoch_end(self) -> None:
        loss = self.test_loss.compute()
        self.log_dict({"test/loss": loss, "test/ppl": loss.exp()})
        self.test_loss.reset()

    def configure_optimizers(self):
        max_steps = self.trainer.max_steps
        if max_steps is None or max_steps < 1:
            raise ValueError("set trainer.max_steps: the learning-rate schedule is sized from it")
        matrices = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        others = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        hp = self.hparams
        optimizer = torch.optim.AdamW(
            [{"params": matrices, "weight_decay": hp["weight_decay"]}, {"params": others, "weight_decay": 0.0}],
            lr=hp["lr"],
            betas=tuple(hp["betas"]),
            eps=hp["eps"],
            fused=True,  # fused: skips flagged steps on the device
        )
        multiplier = partial(
            lr_multiplier,
            max_steps=max_steps,
            schedule=hp["schedule"],
            warmup_steps=hp["warmup_steps"],
            decay_fraction=hp["decay_fraction"],
            min_ratio=hp["min_lr_ratio"],
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- throughput --------------------------------------------------------------------------------------------
    def flops_per_token(self, length: int) -> float:
        """Training FLOPs per token (forward + backward): ``6 N`` plus causal attention ``6 L d T`` (PaLM)."""
        c = self.config
        assert c.hidden_size and c.num_layers  # DecoderConfig fills its shape
        matmul_params = self.decoder.num_parameters() - c.vocab_size * c.hidden_size * (1 if c.tie_embeddings else 0)
        matmul_params += c.vocab_size * c.hidden_size  # the LM head is a matmul even when tied
        return 6 * matmul_params + 6 * c.num_layers * c.hidden_size * length

    @property
    def flops_per_batch(self) -> float | None:
        """Read by Lightning's ``ThroughputMonitor`` to report MFU (on devices whose peak FLOP/s it knows)."""
        if self._batch_shape is None:
            return None
        batch, length = self._batch_shape
        return self.flops_per_token(length) * batch * length

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Refuse to write a checkpoint after a non-finite step or with non-finite weights."""
        self.check_finite()
        bad = [name for name, p in self.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise FloatingPointError(
                f"non-finite weights in {', '.join(bad[:5])} at step {self.global_step}: "
                "checkpoint not written, the earlier ones are untouched"
            )
        checkpoint["tokens_seen"] = self.tokens_seen

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokens_seen = checkpoint.get("tokens_seen", 0)
        self.checkpoint_step = checkpoint.get("global_step")
        trainer = self._trainer
        if trainer is not None and trainer.state.fn in ("validate", "test") and self.checkpoint_step is not None:
            # Lightning restores the step only for fit: log validate/test scalars at the checkpoint's step, not 0
            trainer.fit_loop.epoch_loop._batches_that_stepped = self.checkpoint_step
