"""Data the tests build themselves: parquet in FineWeb-Edu's schema, and the builtin tokenizer."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

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
