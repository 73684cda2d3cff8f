"""Tokens/s of the whole data pipeline (read parquet, tokenize, pack, collate) beside the tokenizer alone.

    python benchmarks/data_throughput.py [--megabytes 40] [--seq-len 2048] [--tokenizer builtin]

Both run single-threaded (RAYON_NUM_THREADS=1), as one DataLoader worker does. Goals: pipeline time <= 1.25x the
tokenizer's; per-worker tokens/s such that 8 workers give ~1M tokens/s.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import DataLoader

from blindheads.datamodules.builtin_corpus import builtin_documents
from blindheads.datamodules.sources import stream_documents
from blindheads.datamodules.tokenizer import default_cache_dir, load_tokenizer
from blindheads.datamodules.windows import DOC_BATCH, TokenWindows, collate_windows


def write_parquet(directory: Path, megabytes: int, num_files: int = 4) -> tuple[str, ...]:
    texts = [text for _, text in builtin_documents()]
    rows, size = [], 0
    for text in itertools.cycle(texts):
        rows.append(text)
        size += len(text)
        if size > megabytes * 2**20:
            break
    paths = []
    for i in range(num_files):
        path = directory / f"part-{i}.parquet"
        pq.write_table(pa.table({"text": rows[i::num_files]}), path)
        paths.append(str(path))
    return tuple(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=40)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--tokenizer", default="builtin")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.tokenizer, default_cache_dir())
    with tempfile.TemporaryDirectory() as tmp:
        files = write_parquet(Path(tmp), args.megabytes)
        texts = [row["text"] for row in stream_documents(files, "parquet", "text")]

        start = time.perf_counter()
        tokens = 0
        for i in range(0, len(texts), DOC_BATCH):
            encodings = tokenizer.backend_tokenizer.encode_batch_fast(
                texts[i : i + DOC_BATCH], add_special_tokens=False
            )
            tokens += sum(len(e.ids) for e in encodings)
        tokenizer_seconds = time.perf_counter() - start

        windows = TokenWindows(
            stream_documents(files, "parquet", "text"),
            tokenizer.backend_tokenizer,
            tokenizer.eos_token_id,
            args.seq_len,
            repeat=False,
        )
        loader = DataLoader(windows, batch_size=args.batch_size, num_workers=0, collate_fn=collate_windows)
        start = time.perf_counter()
        packed = sum(batch["input_ids"].shape[0] * args.seq_len for batch in loader)
        pipeline_seconds = time.perf_counter() - start

    print(f"{args.megabytes} MB of text, {len(texts)} documents, tokenizer {args.tokenizer}, seq_len {args.seq_len}")
    print(f"tokenizer alone : {tokens / tokenizer_seconds:>12,.0f} tokens/s ({tokens:,} tokens)")
    print(f"whole pipeline  : {packed / pipeline_seconds:>12,.0f} tokens/s ({packed:,} tokens in windows)")
    print(f"pipeline / tokenizer time per token: {(pipeline_seconds / packed) / (tokenizer_seconds / tokens):.2f}x")
    print(f"8 workers would give about {8 * packed / pipeline_seconds:,.0f} tokens/s")


if __name__ == "__main__":
    main()
