"""Where documents come from: the Hugging Face Hub, local files, or the builtin corpus, all read by one code path
(``datasets`` streaming over a list of data files). The last data file is held out for validation."""

from __future__ import annotations

import glob
import os
import random
from dataclasses import dataclass
from pathlib import Path

import datasets

from blindheads.datamodules.builtin_corpus import write_builtin_corpus
from blindheads.datamodules.hub import require_hub
from blindheads.datamodules.validation import check_files, check_regular

SOURCES = ("hub", "files", "builtin")
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text"}


@dataclass(frozen=True)
class DataFiles:
    """The files a run reads, in their fixed order: training files and the held-out validation file(s)."""

    train: tuple[str, ...]
    validation: tuple[str, ...]
    format: str


def format_of(files: list[str]) -> str:
    """The ``datasets`` builder that reads ``files`` (all of one kind: parquet, json lines or text)."""
    suffixes = {Path(f.removesuffix(".gz")).suffix for f in files}
    formats = {FORMATS.get(suffix, "") for suffix in suffixes}
    if "" in formats or len(formats) != 1:
        raise ValueError(
            f"data files must all be one of {sorted(FORMATS)} (optionally .gz); got suffixes {sorted(suffixes)}"
        )
    return formats.pop()


def expand_files(patterns: list[str] | str) -> list[str]:
    """Local files or globs, sorted within each pattern; a pattern matching nothing is an error."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    if not patterns:
        raise ValueError("source 'files' needs at least one path or glob in data.files")
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(str(Path(pattern).expanduser()), recursive=True))
        if not matches:
            raise FileNotFoundError(f"no files match {pattern!r}")
        files += matches
    return files


def hub_files(name: str, config: str) -> list[str]:
    """The data files of a Hub dataset config (``hf://`` paths), resolved without downloading them."""
    require_hub(f"dataset {name}", "use data.source=files with downloaded shards, or data.source=builtin offline")
    try:
        builder = datasets.load_dataset_builder(name, config)
    except ValueError as error:  # datasets names the available configs
        raise ValueError(f"unknown config {config!r} for {name}: {error}") from None
    except (ConnectionError, OSError) as error:
        raise ConnectionError(
            f"cannot reach the Hugging Face Hub for {name} ({error.__class__.__name__}: {error}); "
            "use data.source=files with downloaded shards, or data.source=builtin offline"
        ) from None
    return list(builder.config.data_files["train"])


def data_files(
    source: str,
    files: list[str] | str | None = None,
    validation_files: list[str] | str | None = None,
    hub_name: str = "HuggingFaceFW/fineweb-edu",
    hub_config: str = "sample-100BT",
    cache_dir: str | Path = ".",
    shuffle_files_seed: int | None = None,
) -> DataFiles:
    """Resolve a source to its files. Unless ``validation_files`` are given, the last file is held out."""
    if source == "hub":
        all_files = hub_files(hub_name, hub_config)
    elif source == "files":
        all_files = expand_files(files or [])
    elif source == "builtin":
        all_files = [str(path) for path in write_builtin_corpus(cache_dir)]
    else:
        raise ValueError(f"unknown data source {source!r}; valid: {', '.join(SOURCES)}")
    if validation_files:
        held_out = expand_files(validation_files)
        named = {_resolved(f) for f in ([files] if isinstance(files, str) else files or []) if not glob.has_magic(f)}
        held = {_resolved(f) for f in held_out}
        # a held-out file that a glob of data.files matches is left out of training; one named in both is refused
        train = [f for f in all_files if _resolved(f) not in held or _resolved(f) in named]
        if not train:
            raise ValueError(
                f"data.validation_files holds out every file of data.files ({', '.join(all_files[:3])}"
                f"{', ...' * (len(all_files) > 3)}): nothing is left to train on; give other data.validation_files"
            )
    elif len(all_files) < 2:
        raise ValueError(
            f"source {source!r} has one file ({all_files[0]}); the last file is held out for validation, so give "
            "at least two files or name the held-out ones in data.validation_files"
        )
    else:
        train, held_out = all_files[:-1], all_files[-1:]
    for path in (*train, *held_out):  # as soon as they are listed: a FIFO or a device is refused before any read
        if "://" not in path:
            check_regular(path)
    check_disjoint(train, held_out)
    if shuffle_files_seed is not None:
        random.Random(shuffle_files_seed).shuffle(train)
    return DataFiles(tuple(train), tuple(held_out), format_of(train + held_out))


def _resolved(path: str) -> str:
    """A local file by where it is (links and ``..`` resolved), a remote one by its path."""
    return path if "://" in path else os.path.realpath(Path(path).expanduser())


def check_disjoint(train: list[str], validation: list[str]) -> None:
    """Refuse a file that is both trained on and held out (compared as resolved paths, so a link or another spelling
    of a path is the same file): validation on it would measure memorisation."""
    held = {_resolved(f) for f in validation}
    both = list(dict.fromkeys(f for f in train if _resolved(f) in held))
    if both:
        raise ValueError(
            f"data file(s) {', '.join(both)} given for both training and validation (as the same file after resolving "
            "links): a held-out file must not be trained on; give each file in data.files or in data.validation_files "
            "(without data.validation_files the last file of data.files is held out), not both"
        )


def stream_documents(files: tuple[str, ...], format: str, text_column: str) -> datasets.IterableDataset:
    """A streaming dataset of the files' documents, keeping only ``text_column``; one shard per file. Local files
    are checked first (``check_files``), so a bad file fails here, naming itself, before training reads it."""
    check_files(files, format, text_column)
    kwargs = {"sample_by": "document"} if format == "text" else {}
    stream = datasets.load_dataset(format, data_files=list(files), split="train", streaming=True, **kwargs)
    try:  # read the first document now, so an unreadable or empty source fails here, not in a worker
        first = next(iter(stream.take(1)), None)
    except Exception as error:
        raise ValueError(f"cannot read {files[0]} as {format}: {error}") from None
    if first is None:
        raise ValueError(f"the data files {list(files)[:3]}... hold no documents: the source is empty")
    if text_column not in first:
        raise ValueError(f"text column {text_column!r} not found in {files[0]}; columns: {list(first)}")
    return stream.select_columns([text_column])
