"""A Lightning checkpoint read outside Lightning (``blindheads export``, the lm-eval adapter): the file loaded once,
then its decoder configuration, its weights and the tokenizer the run trained with."""

from __future__ import annotations

from pathlib import Path

import torch

from blindheads.datamodules.tokenizer import default_cache_dir, load_tokenizer
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder


def load_checkpoint(ckpt_path: str | Path) -> dict:
    """The checkpoint's contents, on the CPU (it holds our configs and data state, so not ``weights_only``)."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {ckpt_path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # truncated, corrupt, or another format
        raise ValueError(f"not a blindheads checkpoint: {ckpt_path} ({type(error).__name__}: {error})") from None
    if not isinstance(checkpoint, dict) or "decoder" not in checkpoint.get("hyper_parameters", {}):
        raise ValueError(f"not a blindheads checkpoint: {ckpt_path} (no decoder hyperparameters inside)")
    return checkpoint


def decoder_config(checkpoint: dict) -> DecoderConfig:
    config = checkpoint["hyper_parameters"]["decoder"]
    return config if isinstance(config, DecoderConfig) else DecoderConfig(**config)


def decoder_state(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The decoder's weights, keyed as in ``Decoder`` (the LightningModule holds it as ``decoder``)."""
    return {k.removeprefix("decoder."): v for k, v in checkpoint["state_dict"].items() if k.startswith("decoder.")}


def checkpoint_decoder(checkpoint: dict) -> Decoder:
    """The trained decoder, in eval mode."""
    decoder = Decoder(decoder_config(checkpoint))
    decoder.load_state_dict(decoder_state(checkpoint))
    return decoder.eval()


def checkpoint_tokenizer(checkpoint: dict):
    """The tokenizer the run trained with (the data module's settings), or ``None`` if the checkpoint has none."""
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    if "tokenizer" not in data:
        return None
    return load_tokenizer(
        data["tokenizer"], data.get("cache_dir") or default_cache_dir(), data.get("builtin_vocab_size", 4096)
    )
