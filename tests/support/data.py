"""Data the tests build themselves (parquet in FineWeb-Edu's schema) and data modules on the builtin corpus and
tokenizer, read in the main process."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from blindheads.datamodules.text import TextData

WORDS = [
    "the",
    "grass",
    "is",
    "green",
    "sky",
    "blue",
    "sun",
    "yellow",
    "river",
    "flows",
    "past",
    "old",
    "mill",
    "where",
    "children",
    "learn",
    "to",
    "read",
    "and",
    "count",
]
MARKER = re.compile(r"doc (\d{5}) begins")


def document_text(number: int, rng: random.Random) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
    return f"doc {number:05d} begins. {body}."


def write_fineweb_parquet(directory: Path, num_files: int, docs_per_file: int, seed: int = 0) -> list[Path]:
    """Files with every FineWeb-Edu column; document ``n`` says ``doc n begins`` so tests can count documents."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths, number = [], 0
    for file in range(num_files):
        rows = []
        for _ in range(docs_per_file):
            text = document_text(number, rng)
            rows.append(
                {
                    "text": text,
                    "id": f"<urn:uuid:{number:08d}>",
                    "dump": "CC-MAIN-2024-10",
                    "url": f"https://example.org/{number}",
                    "date": "2024-02-20T00:00:00Z",
                    "file_path": f"s3://commoncrawl/{file}.warc.gz",
                    "language": "en",
                    "language_score": 0.95,
                    "token_count": len(text.split()),
                    "score": 3.2,
                    "int_score": 3,
                }
            )
            number += 1
        path = directory / f"train-{file:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
    return paths


def builtin_data(cache_dir, seq_len: int, batch_size: int, val_windows: int, **kwargs) -> TextData:
    """The offline builtin corpus and tokenizer, read in the main process."""
    return TextData(source="builtin", tokenizer="builtin", seq_len=seq_len, batch_size=batch_size,
                      val_windows=val_windows, cache_dir=str(cache_dir), num_workers=0, **kwargs)  # fmt: skip


def make_datamodule(cache_dir, files=None, **kwargs) -> TextData:
    """A data module set up for fitting: the builtin corpus, or ``files`` when given; 4 windows of 32 tokens a batch
    unless ``kwargs`` say otherwise."""
    options = {
        "source": "files" if files else "builtin",
        "files": files,
        "tokenizer": "builtin",
        "seq_len": 32,
        "batch_size": 4,
        "num_workers": 0,
        "val_windows": 4,
        "cache_dir": str(cache_dir),
    }
    dm = TextData(**{**options, **kwargs})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def take(dm, count):
    """The first ``count`` training batches, passed through the datamodule as Lightning does."""
    return [dm.on_after_batch_transfer(b, 0) for b in itertools.islice(dm.train_dataloader(), count)]


def resume_state(cache_dir, files, **kwargs) -> dict:
    """The data module's state after 3 training batches, as a checkpoint would hold it."""
    dm = make_datamodule(cache_dir, files, **kwargs)
    take(dm, 3)
    return dm.state_dict()
