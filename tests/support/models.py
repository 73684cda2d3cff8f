"""A tiny LightningModule and a quiet CPU trainer for in-process training tests."""

from __future__ import annotations

import lightning as L

from blindheads.modules.config import DecoderConfig
from blindheads.modules.lm import DecoderLM


def tiny_lm(lm: dict | None = None, **decoder) -> DecoderLM:
    """The tiny preset as a LightningModule for the builtin tokenizer, on the SDPA path; ``decoder`` overrides fields."""
    return DecoderLM(
        DecoderConfig.from_preset("tiny", **{"vocab_size": 4096, "attention": "sdpa", **decoder}), **(lm or {})
    )


def cpu_trainer(**kwargs) -> L.Trainer:
    """A quiet CPU trainer: no logger, validation, checkpoints, progress bar or summary unless ``kwargs`` ask."""
    quiet = {"logger": False, "limit_val_batches": 0, "enable_checkpointing": False, "enable_progress_bar": False,
             "enable_model_summary": False}  # fmt: skip
    return L.Trainer(accelerator="cpu", **{**quiet, **kwargs})
