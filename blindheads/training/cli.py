"""``blindheads fit | validate | test``: LightningCLI over the decoder LM and the FineWeb-Edu data module."""

from __future__ import annotations

import os
import sys

import torch
from lightning.pytorch.cli import LightningCLI

from blindheads.callbacks.results import ResultsFile
from blindheads.datamodules.fineweb import FineWebEdu
from blindheads.modules.lm import DecoderLM
from blindheads.training.checkpoint_io import AtomicCheckpointIO

TRAINER_DEFAULTS = {"gradient_clip_val": 1.0}
KEEP_SUBNORMALS = "BLINDHEADS_KEEP_SUBNORMALS"


class BlindheadsCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The model's vocabulary is the tokenizer's (rounded up to a multiple of 64).
        parser.link_arguments(
            "data", "model.decoder.vocab_size", compute_fn=lambda data: data.vocab_size, apply_on="instantiate"
        )

    def instantiate_trainer(self, **kwargs):
        """Every run writes checkpoints atomically; ``test`` also writes ``results.json``."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        plugins = trainer_config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        trainer = super().instantiate_trainer(plugins=[AtomicCheckpointIO(), *plugins], **kwargs)
        if self.subcommand == "test":
            trainer.callbacks.append(ResultsFile())
        return trainer


def flush_subnormals_unless_asked_not_to() -> None:
    """CPU arithmetic on subnormals is slow (ALiBi's softmax is full of them) and fused GPU kernels flush them, so
    runs flush them too: the ``normal`` threshold then holds on every device. Must run before any thread starts,
    as new threads inherit the flag. ``BLINDHEADS_KEEP_SUBNORMALS=1`` keeps them."""
    if os.environ.get(KEEP_SUBNORMALS, "0") in ("", "0"):
        torch.set_flush_denormal(True)


def build_cli(args: list[str] | None, run: bool = True) -> BlindheadsCLI:
    """The CLI over ``args`` (a subcommand first when ``run``); ``run=False`` only parses and instantiates."""
    return BlindheadsCLI(
        DecoderLM, FineWebEdu, args=args, run=run, trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
    )


def main(argv: list[str]) -> BlindheadsCLI:
    flush_subnormals_unless_asked_not_to()
    # From the console script the arguments are sys.argv's; LightningCLI warns when given both.
    return build_cli(None if argv == sys.argv[1:] else argv)
