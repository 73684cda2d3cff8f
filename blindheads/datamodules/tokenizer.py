"""Tokenizers: any Hugging Face tokenizer by name or path, or ``builtin``, a byte-level BPE trained offline on the
builtin corpus and saved as a Hugging Face tokenizer directory, so both load through ``AutoTokenizer``."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from blindheads.datamodules.builtin_corpus import builtin_documents
from blindheads.datamodules.cache import cache_folder, mark, remove_made
from blindheads.datamodules.hub import require_hub

log = logging.getLogger(__name__)

BUILTIN = "builtin"
EOS = "<|endoftext|>"
OFFLINE_HINT = f"give a local tokenizer directory, or '{BUILTIN}' for the offline tokenizer"


def default_cache_dir() -> Path:
    return Path(os.environ.get("BLINDHEADS_CACHE", Path.home() / ".cache" / "blindheads"))


BUILTIN_VOCAB = (257, 1 << 20)  # the byte alphabet and EOS at least; a bound no embedding table comes near


def builtin_tokenizer_dir(cache_dir: str | Path, vocab_size: int) -> Path:
    """The builtin tokenizer's folder in ``cache_dir``: its name holds ``vocab_size``, which must be an integer (a
    checkpoint's ``"1024/../../x"`` would name a folder anywhere)."""
    low, high = BUILTIN_VOCAB
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not low <= vocab_size <= high:
        raise ValueError(f"builtin_vocab_size must be an integer from {low} to {high}, got {vocab_size!r}")
    return Path(cache_dir) / f"builtin-tokenizer-{vocab_size}"


def train_builtin_tokenizer(cache_dir: str | Path, vocab_size: int = 4096) -> Path:
    """Train (once; written atomically) a byte-level BPE on the builtin corpus; its only special token is EOS."""
    target = cache_folder(builtin_tokenizer_dir(cache_dir, vocab_size), "the builtin tokenizer")
    if target.exists():
        return target
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator((text for _, text in builtin_documents()), trainer=trainer)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS).save_pretrained(staging)
    mark(staging)
    try:
        os.rename(staging, target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_tokenizer_path(name: str, cache_dir: str | Path, builtin_vocab_size: int = 4096) -> str:
    return str(train_builtin_tokenizer(cache_dir, builtin_vocab_size)) if name == BUILTIN else name


def _from_pretrained(path: str) -> PreTrainedTokenizerFast:
    """A local directory, else the Hub's cache, else the Hub, asked first whether it is reachable."""
    if not Path(path).exists():
        try:
            return cast(
                PreTrainedTokenizerFast,
                AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False),
            )
        except OSError:
            require_hub(f"tokenizer {path!r}", OFFLINE_HINT)
    return cast(
        PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    )  # fast by default; never its code


def tokenizer_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """The data options (``data.*``, or a checkpoint's record of them) that choose the tokenizer: its name, and for
    the builtin one its vocabulary size (another size is another tokenizer: other merges, other token ids)."""
    name = data.get("tokenizer")
    return {"tokenizer": name, **({"builtin_vocab_size": data.get("builtin_vocab_size")} if name == BUILTIN else {})}


def padded_vocab_size(tokenizer: PreTrainedTokenizerFast) -> int:
    """The model's vocabulary for ``tokenizer``: its tokens, rounded up to a multiple of 64 (faster matrix
    multiplies)."""
    return -(-len(tokenizer) // 64) * 64


def load_tokenizer(name: str, cache_dir: str | Path, builtin_vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """The tokenizer ``name`` (hub name, local path, or ``builtin``); it must have an EOS token to separate documents."""
    path = resolve_tokenizer_path(name, cache_dir, builtin_vocab_size)
    try:
        tokenizer = _from_pretrained(path)
    except ConnectionError as error:
        raise ValueError(f"cannot load tokenizer {name!r}: {error}") from None
    except OSError as error:
        raise ValueError(
            f"cannot load tokenizer {name!r} ({error.__class__.__name__}); {OFFLINE_HINT}, or a Hugging Face Hub "
            "name with the Hub reachable"
        ) from None
    except Exception as error:  # files that exist but cannot be parsed: a truncated or damaged cache
        if name != BUILTIN:
            raise ValueError(f"tokenizer {name!r}: the files in {path} cannot be read ({type(error).__name__}: "
                             f"{str(error)[:120]}); delete them to download them again") from None  # fmt: skip
        why = f"cannot be read ({type(error).__name__})"
        remove_made(Path(path), "the builtin tokenizer", why)  # only a folder the project made is ever removed
        log.warning(f"the cached builtin tokenizer in {path} {why}; rebuilding it")
        tokenizer = _from_pretrained(resolve_tokenizer_path(name, cache_dir, builtin_vocab_size))
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {name!r} has no EOS token to separate documents")
    return tokenizer
