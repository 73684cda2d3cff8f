"""Checkpoints read safely: a file named as a checkpoint checked to be one, its step read without its weights, the
newest intact one of a run found. (Building a decoder and a tokenizer from what was read: ``checkpoints.rebuild``.)

A checkpoint is a pickle, and unpickling runs whatever callables it names: every load in the project goes through
``read_checkpoint``, which unpickles tensors, plain data and the project's own configuration classes only
(``weights_only`` with ``OWN_TYPES`` allowed). A blindheads checkpoint holds nothing else, so a file that needs more
is refused, naming what it asked for, and nothing in it runs.
"""

from __future__ import annotations

import pickle
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch

from blindheads.datamodules.retrieval_mix import RetrievalMix
from blindheads.modules.config import DecoderConfig, UnpickledConfigError


def refused_code(error: BaseException) -> str | None:
    """What a ``weights_only`` load refused, in words (``it asks to run posix.system; ...``), or ``None`` when the
    error is of another kind."""
    unsafe = re.search(r"(?:GLOBAL|global) ([\w.]+)", str(error))
    if not isinstance(error, pickle.UnpicklingError) or unsafe is None:
        return None
    return (f"it asks to run {unsafe.group(1)}; only tensors, plain data and blindheads configs are unpickled, so it "
            "was refused and nothing in it ran")  # fmt: skip


# Hyperparameters of a model or data module built in Python, not from YAML: unpickled by every ``weights_only`` load
# in this process (Lightning's own reading of a checkpoint's hyperparameters too), and nothing else of the project.
OWN_TYPES = (DecoderConfig, RetrievalMix)
torch.serialization.add_safe_globals([DecoderConfig, RetrievalMix])


def not_a_checkpoint(path, error: BaseException) -> str:
    """One line for a file that cannot be a checkpoint, naming it and why (never torch's ``weights_only`` advice)."""
    if code := refused_code(error):
        return f"not a blindheads checkpoint: {path} ({code})"
    reasons = {
        pickle.UnpicklingError: "not a PyTorch checkpoint file",
        KeyError: "no Lightning checkpoint inside",
        zipfile.BadZipFile: "not a PyTorch checkpoint file",
        IsADirectoryError: "a directory, not a file",
    }
    reason = cut_short(path, error) or next(
        (text for kind, text in reasons.items() if isinstance(error, kind)), type(error).__name__
    )
    return f"not a blindheads checkpoint: {path} ({reason})"


ZIP_START = b"PK\x03\x04"  # torch.save writes a zip archive, whose index is at its end


def cut_short(path, error: BaseException) -> str | None:
    """``empty or truncated: N bytes`` for a local file that ended before torch could read it (an empty file, a
    file cut short by a full disk or a killed copy: torch says ``EOFError``, or for a zip archive without its end
    ``RuntimeError`` or ``OSError``); a zip archive torch cannot read otherwise is damaged, another file torch's zip
    reader refuses is no checkpoint; else ``None``."""
    if "://" in str(path) or not isinstance(error, (EOFError, RuntimeError, OSError)):
        return None
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as file:
            start = file.read(len(ZIP_START))
    except OSError:  # gone, a directory, no permission: named by the error's own kind
        return None
    ended = isinstance(error, (EOFError, OSError)) or any(
        words in str(error) for words in ("central directory", "not a ZIP archive")
    )
    if size == 0 or (ended and (start == ZIP_START or isinstance(error, EOFError))):
        return f"empty or truncated: {size} bytes"
    if start == ZIP_START:
        return f"a damaged PyTorch checkpoint file: {size} bytes"
    return "not a PyTorch checkpoint file" if isinstance(error, RuntimeError) else None  # torch's zip reader's words


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
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except UnpickledConfigError as error:  # a whole checkpoint, its decoder config holding a value refused
        raise ValueError(f"{path}: its decoder config: {error}") from None
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
