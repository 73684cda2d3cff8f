"""A Lightning checkpoint as a Hugging Face model directory (the command: ``blindheads.cli.export``)."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from blindheads.atomic import remove_debris, staging_path
from blindheads.checkpoints.reading import load_checkpoint
from blindheads.checkpoints.rebuild import checkpoint_tokenizer, decoder_config
from blindheads.disk import DiskFull, no_space
from blindheads.export.hf import BlindheadsConfig, BlindheadsForCausalLM
from blindheads.export.llama import as_llama, rope_theta
from blindheads.export.remote import ENTRY, flat_name, remote_code
from blindheads.export.tokenizer import plain_tokenizer
from blindheads.modules.position.registry import builtin_names

AUTO_MAP = {  # config.json's auto_map: each FILE.CLASS a stub importing its class from the shipped modules
    "AutoConfig": "configuration_blindheads.BlindheadsConfig",
    "AutoModelForCausalLM": "modeling_blindheads.BlindheadsForCausalLM",
}


def export(ckpt_path: str | Path, out: str | Path, tokenizer: str | None = None) -> Path:
    """Write config, safetensors weights and the tokenizer into ``out``, a new or empty directory (an export never
    overwrites another's files). A decoder whose position stack is RoPE alone is written as a plain transformers
    ``LlamaForCausalLM`` (no remote code); any other with its remote code (``remote``: the package's modules the
    model needs, so transformers alone loads it with ``trust_remote_code=True``). The tokenizer is the run's own
    (``checkpoint_tokenizer``), or ``tokenizer``, written as plain data (``plain_tokenizer``: no ``auto_map``, chat
    template or tokenizer class of another's, so the folder's only code is the package's; one that cannot be is
    refused before anything is written). The checkpoint's decoder config is checked against its weights before a
    model is built. A full disk ends it in one line. The files are written into a folder beside ``out`` and
    renamed into place whole: an export killed part-way leaves no ``out`` to mistake for a model, and the next
    export removes what it left."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        held = (
            "is a file" if not out.is_dir() else f"already holds {', '.join(sorted(p.name for p in out.iterdir())[:4])}"
        )
        raise ValueError(f"--out {out} {held}: export into a new or empty directory")
    checkpoint = load_checkpoint(ckpt_path)
    decoder = decoder_config(checkpoint, ckpt_path)
    decoder = replace(decoder, position=builtin_names(decoder.position))  # the shipped code knows no package path
    config = BlindheadsConfig.from_decoder_config(decoder, auto_map=AUTO_MAP)
    model = BlindheadsForCausalLM(config)
    state = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith("decoder.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in model._tied_weights_keys]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {ckpt_path} does not match its decoder: missing {missing}, unexpected {unexpected}"
        )
    llama = rope_theta(model.decoder) is not None
    loaded = checkpoint_tokenizer(checkpoint, tokenizer)
    plain = None if loaded is None else plain_tokenizer(loaded, tokenizer or loaded.name_or_path)
    staging = staging_path(out)
    try:
        remove_debris(out.parent, out.name)
        if llama:  # a standard checkpoint: transformers alone loads it
            as_llama(model.decoder).save_pretrained(staging)
        else:
            model.save_pretrained(staging)
            for name, text in remote_code().items():
                (staging / name).write_text(text)
            for reference in AUTO_MAP.values():
                stem, cls = reference.split(".")
                (staging / f"{stem}.py").write_text(f"from .{flat_name(ENTRY)} import {cls}  # noqa: F401\n")
        if plain is not None:
            plain.save_pretrained(staging)
        os.replace(staging, out)  # an empty ``out`` is replaced; one written meanwhile makes this fail
    except Exception as error:  # safetensors' writer raises its own error on a full disk, not an OSError
        if no_space(error) is not None:
            raise DiskFull(out, advice="free some space, then export again") from None
        if not isinstance(error, OSError):
            raise
        raise ValueError(f"--out {out}: cannot be written ({error.strerror or error})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
