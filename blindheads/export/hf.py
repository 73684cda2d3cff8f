"""Exported blindheads models in this process: importing this module registers their classes (``modeling``) with
the Auto classes, so a folder loads with no remote code and no prompt, and ``check_export`` checks a folder's config
against its weights before anything is built."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from blindheads.checkpoints.rebuild import check_weights
from blindheads.export.modeling import BlindheadsConfig, BlindheadsForCausalLM

__all__ = ["BlindheadsConfig", "BlindheadsForCausalLM", "check_export"]


def check_export(folder: Path) -> None:
    """An exported model's ``config.json`` against its weights' shapes, read from the safetensors header (no weight
    is loaded, no model built): one line naming the mismatch, not transformers' report and traceback."""
    try:
        config = BlindheadsConfig.from_pretrained(folder).decoder_config()
    except ValueError as error:
        raise ValueError(f"{folder}/{error}") from None
    weights = folder / "model.safetensors"
    if not weights.is_file():  # sharded or another format: transformers' own checks
        return
    with safe_open(weights, "pt") as file:
        shapes = {key.removeprefix("decoder."): tuple(file.get_slice(key).get_shape()) for key in file.keys()}  # noqa: SIM118  (a safetensors file, not a dict)
    if config.tie_embeddings and "embed.weight" in shapes:  # saved once, under the embedding's name
        shapes.setdefault("lm_head.weight", shapes["embed.weight"])
    check_weights(config, shapes, folder)


# Importing this module makes exported directories load with the Auto classes and no remote code (and so no
# "trust_remote_code [y/N]" prompt, which AutoTokenizer also raises: it reads config.json's auto_map first).
AutoConfig.register(BlindheadsConfig.model_type, BlindheadsConfig, exist_ok=True)
AutoModelForCausalLM.register(BlindheadsConfig, BlindheadsForCausalLM, exist_ok=True)
