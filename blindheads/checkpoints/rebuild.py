"""A blindheads checkpoint rebuilt outside Lightning (``blindheads export``, the lm-eval adapter, ``recheck``): its
decoder configuration checked against its weights, the decoder, and the tokenizer the run trained with. The file
itself is read by ``checkpoints.reading``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from blindheads.datamodules.cache import made_here
from blindheads.datamodules.tokenizer import BUILTIN, builtin_tokenizer_dir, default_cache_dir, load_tokenizer
from blindheads.modules.config import DecoderConfig, config_from_fields
from blindheads.modules.decoder import Decoder

log = logging.getLogger(__name__)


def decoder_config(checkpoint: dict, where: str | Path = "the checkpoint") -> DecoderConfig:
    """The checkpoint's decoder configuration, checked against its weights (``check_weights``) before any model is
    built from it: one line naming an unknown key, a bad value or the first weights that do not match."""
    config = checkpoint["hyper_parameters"]["decoder"]
    if not isinstance(config, DecoderConfig):
        config = config_from_fields(config, f"{where}: its decoder config")
    check_weights(config, decoder_state(checkpoint), where)
    return config


def expected_weights(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's shape in a decoder of ``config``, built on the ``meta`` device: no memory is allocated, so a
    config that claims a huge model costs nothing to check."""
    with torch.device("meta"):
        return {key: tuple(value.shape) for key, value in Decoder(config).state_dict().items()}


def check_weights(config: DecoderConfig, state: dict[str, Any], where: str | Path) -> None:
    """Refuse, in one line, a decoder config whose model would not hold ``state`` (the decoder's weights, or their
    shapes as tuples): keys missing or unexpected, or shapes that differ (a config claiming 8 heads for 2-head
    weights)."""
    expected = expected_weights(config)
    shapes = {key: tuple(value.shape) if isinstance(value, torch.Tensor) else value for key, value in state.items()}
    problems = [
        f"{key} is {shapes[key]}, the config makes {expected[key]}"
        for key in expected
        if key in shapes and shapes[key] != expected[key]
    ]
    problems += [f"missing {key}" for key in expected if key not in shapes]
    problems += [f"unexpected {key}" for key in shapes if key not in expected]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError(f"{where}: its decoder config does not match its weights: {'; '.join(problems[:3])}{more}")


def decoder_state(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The decoder's weights, keyed as in ``Decoder`` (the LightningModule holds it as ``decoder``)."""
    return {k.removeprefix("decoder."): v for k, v in checkpoint["state_dict"].items() if k.startswith("decoder.")}


def checkpoint_decoder(checkpoint: dict, where: str | Path = "the checkpoint") -> Decoder:
    """The trained decoder, in eval mode: its config checked against its weights before it is built."""
    decoder = Decoder(decoder_config(checkpoint, where))
    decoder.load_state_dict(decoder_state(checkpoint))
    return decoder.eval()


TOKENIZER_HINT = "give the run's tokenizer (export --tokenizer PATH, lm_eval --model_args tokenizer=PATH)"


def checkpoint_tokenizer(checkpoint: dict, tokenizer: str | None = None):
    """The tokenizer the run trained with (or ``tokenizer``, a name or path the user gives), ``None`` if the
    checkpoint names none. Nothing the checkpoint holds chooses a path that is written or removed: its data settings
    are checked (the tokenizer a name, the builtin vocabulary an integer, so no folder name walks out of a cache); a
    builtin tokenizer is read from the run's own cache where blindheads made it (its mark), and otherwise built in
    the user's cache (``$BLINDHEADS_CACHE``, by default ``~/.cache/blindheads``), never in a folder the checkpoint
    names. A tokenizer with more tokens than the decoder's vocabulary is refused."""
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    if tokenizer is None and "tokenizer" not in data:
        return None
    name, vocab = data.get("tokenizer"), data.get("builtin_vocab_size", 4096)
    if name == BUILTIN:
        try:
            builtin_tokenizer_dir(".", vocab)  # the folder's name holds it: an integer, nothing else
        except ValueError as error:
            raise ValueError(f"the checkpoint's data settings: {error}; {TOKENIZER_HINT}") from None
    if tokenizer is not None:
        loaded, where = load_tokenizer(tokenizer, default_cache_dir(), vocab if name == BUILTIN else 4096), tokenizer
    elif not isinstance(name, str) or not name.strip():
        raise ValueError(f"the checkpoint's data.tokenizer is {name!r}, not a tokenizer name or path; {TOKENIZER_HINT}")
    elif name != BUILTIN:  # a Hub name or a local folder: read, never written or removed
        loaded, where = load_tokenizer(name, default_cache_dir()), name
    else:
        run_cache = data.get("cache_dir")
        own = builtin_tokenizer_dir(run_cache, vocab) if isinstance(run_cache, str) else None
        if own is not None and made_here(own):
            loaded, where = load_tokenizer(str(own), default_cache_dir()), str(own)  # read as a folder: kept as it is
        else:
            loaded = load_tokenizer(BUILTIN, default_cache_dir(), vocab)
            where = str(builtin_tokenizer_dir(default_cache_dir(), vocab))
            log.warning(f"the run's builtin tokenizer is not in its cache ({own}); using {where}")
    vocab_size = decoder_config(checkpoint).vocab_size
    if len(loaded) > vocab_size:
        raise ValueError(f"the tokenizer {where} has {len(loaded)} tokens, more than the checkpoint's vocabulary of "
                         f"{vocab_size}; {TOKENIZER_HINT}")  # fmt: skip
    return loaded
