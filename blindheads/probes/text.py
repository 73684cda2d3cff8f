"""Real text for probes, as token sequences in the probed model's own tokenizer."""

from __future__ import annotations

import torch

from blindheads.datamodules.builtin_corpus import builtin_documents
from blindheads.datamodules.sources import expand_files, format_of, stream_documents


def documents(text: list[str] | str) -> list[str]:
    """``builtin`` (the offline corpus) or local files (parquet, jsonl, txt) with a ``text`` column."""
    if text == "builtin" or text == ["builtin"]:
        return [body for _, body in builtin_documents()]
    files = tuple(expand_files(text))
    return [row["text"] for row in stream_documents(files, format_of(list(files)), "text")]


def token_stream(tokenizer, texts: list[str], count: int) -> torch.Tensor:
    """The first ``count`` tokens of the documents, each followed by the tokenizer's EOS (repeated if short)."""
    separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    tokens: list[int] = []
    while len(tokens) < count:
        before = len(tokens)
        for text in texts:
            tokens += tokenizer(text, add_special_tokens=False).input_ids + separator
            if len(tokens) >= count:
                break
        if len(tokens) == before:
            raise ValueError("the probe text holds no tokens")
    return torch.tensor(tokens[:count], dtype=torch.long)
