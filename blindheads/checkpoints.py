"""Checkpoints read safely, and a Lightning checkpoint read outside Lightning (``blindheads export``, the lm-eval
adapter): the file loaded once, then its decoder configuration, its weights and the tokenizer the run trained with.

A checkpoint is a pickle, and unpickling runs whatever callables it names: every load in the project goes through
``read_checkpoint``, which unpickles tensors, plain data and the project's own configuration classes only
(``weights_only`` with ``OWN_TYPES`` allowed). A blindheads checkpoint holds nothing else, so a file that needs more
is refused, naming what it asked for, and nothing in it runs.
"""

from __future__ import annotations

import logging
import pickle
import re
import stat
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from blindheads.datamodules.cache import made_here
from blindheads.datamodules.retrieval_mix import RetrievalMix
from blindheads.datamodules.tokenizer import BUILTIN, builtin_tokenizer_dir, default_cache_dir, load_tokenizer
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder

log = logging.getLogger(__name__)


def refused_code(error: BaseException) -> str | None:
    """What a ``weights_only`` load refused, in words (``it asks to run posix.system; ...``), or ``None`` when the
    error is of another kind."""
    unsafe = re.search(r"(?:GLOBAL|global) ([\w.]+)", str(error))
    if not isinstance(error, pickle.UnpicklingError) or unsafe is None:
        return None
    return (f"it asks to run {unsafe.group(1)}; only tensors, plain data and blindheads configs are unpickled, so it "
            "was refused and nothing in it ran")  # fmt: skip


OWN_TYPES = [DecoderConfig, RetrievalMix]  # hyperparameters of a model or data module built in Python, not from YAML


def not_a_checkpoint(path, error: BaseException) -> str:
    """One line for a file that cannot be a checkpoint, naming it and why (never torch's ``weights_only`` advice)."""
    if code := refused_code(error):
        return f"not a blindheads checkpoint: {path} ({code})"
    reasons = {
        EOFError: "empty or truncated",
        pickle.UnpicklingError: "not a PyTorch checkpoint file",
        KeyError: "no Lightning checkpoint inside",
        zipfile.BadZipFile: "not a PyTorch checkpoint file",
        IsADirectoryError: "a directory, not a file",
    }
    reason = next((text for kind, text in reasons.items() if isinstance(error, kind)), type(error).__name__)
    return f"not a blindheads checkpoint: {path} ({reason})"


def check_regular_file(path: str | Path) -> Path:
    """The path, if it names a regular file: a FIFO or a device would block or never end, a directory cannot be
    unpickled, and a missing file is named as such."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {path} does not exist") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"not a blindheads checkpoint: {path} (not a regular file)")
    return path


def read_checkpoint(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """A checkpoint file's contents, tensors, plain data and ``OWN_TYPES`` only (``weights_only``); anything else is
    refused in one line (``ValueError``). ``mmap`` maps the tensors instead of reading them: cheap when only the
    small pickled index is wanted."""
    path = check_regular_file(path)
    try:
        with torch.serialization.safe_globals(OWN_TYPES):  # type: ignore[arg-type]  # torch only reads the list: its invariant list[...] is too strict
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as error:  # truncated, corrupt, another format, or objects that would run code
        raise ValueError(not_a_checkpoint(path, error)) from None


def recorded_step(path: Path) -> int | None:
    """The training step a whole checkpoint file was saved at (-1 if it records none), ``None`` if the file is not
    whole (cut short by a full disk, another format). Memory-mapped, so only the small pickled index is read, not
    the weights: asking every checkpoint of a large run costs little. Tensors and plain data only (``weights_only``)."""
    try:
        checkpoint = read_checkpoint(path, mmap=True)
    except (ValueError, OSError):  # truncated, corrupt, another format: not a file to resume from
        return None
    return checkpoint.get("global_step", -1) if isinstance(checkpoint, dict) else None


def newest_intact(directory: Path) -> Path | None:
    """The whole checkpoint in ``directory`` with the latest recorded step (the newer file, then ``last.ckpt``, on a
    tie): what a run resumes from when a later save failed part-way, as on a full disk. Modification times alone
    would pick an older step whose file was touched (copied, restored from a backup) after a newer one."""
    steps = {p: recorded_step(p) for p in Path(directory).glob("*.ckpt") if p.is_file()}
    whole = [p for p, step in steps.items() if step is not None]
    return max(whole, key=lambda p: (steps[p], p.stat().st_mtime_ns, p.name == "last.ckpt"), default=None)


def resume_advice(directory: Path) -> str:
    """What to do after a save into ``directory`` failed on a full disk: the newest intact checkpoint there, then
    ``--ckpt_path last``."""
    resume = newest_intact(directory)
    then = f"the newest intact checkpoint is {resume}; " if resume else ""
    return f"{then}free some space, then resume with --ckpt_path last"


def load_checkpoint(ckpt_path: str | Path) -> dict:
    """A blindheads checkpoint's contents, on the CPU."""
    checkpoint = read_checkpoint(ckpt_path)
    if not isinstance(checkpoint, dict) or "decoder" not in checkpoint.get("hyper_parameters", {}):
        raise ValueError(f"not a blindheads checkpoint: {ckpt_path} (no decoder hyperparameters inside)")
    return checkpoint


def decoder_config(checkpoint: dict, where: str | Path = "the checkpoint") -> DecoderConfig:
    """The checkpoint's decoder configuration, checked against its weights (``check_weights``) before any model is
    built from it: one line naming an unknown key, a bad value or the first weights that do not match."""
    config = checkpoint["hyper_parameters"]["decoder"]
    if not isinstance(config, DecoderConfig):
        config = config_from_fields(config, f"{where}: its decoder config")
    check_weights(config, decoder_state(checkpoint), where)
    return config


def config_from_fields(fields_: Any, what: str) -> DecoderConfig:
    """A ``DecoderConfig`` from a mapping of its fields (``what`` names where they come from), one line naming an
    unknown key or a bad value, never a ``TypeError`` traceback."""
    known = [f.name for f in fields(DecoderConfig)]
    if not isinstance(fields_, dict):
        raise ValueError(f"{what} is {type(fields_).__name__}, not a mapping of decoder fields")
    unknown = sorted(map(str, set(fields_) - set(known)))
    if unknown:
        raise ValueError(f"{what} has unknown keys {', '.join(unknown)}; valid: {', '.join(known)}")
    try:
        return DecoderConfig(**fields_)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{what}: {error}") from None


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
