"""Documents of any length tokenized in bounded memory.

The Rust tokenizer holds about 130 bytes per character while it encodes a text (measured: 1.4 GiB for a 10 MiB
document), so one 100 MB document would take a DataLoader worker down. Texts are therefore encoded in pieces of at
most ``PIECE_CHARS`` characters, at most ``GROUP_PIECES`` pieces' worth of characters at a time (one call for a
batch of ordinary documents, as before). A long text is cut just before a space that starts a word, where byte-level
pre-tokenizers (GPT-2's pattern, SmolLM's, the builtin tokenizer's) split anyway, so its tokens are the whole
text's; only a stretch of ``PIECE_CHARS / 2`` characters without such a space is cut at the limit, where the tokens
around the cut may differ from the whole text's (the same on every run).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from tokenizers import Tokenizer

PIECE_CHARS = 2**18  # characters encoded as one text (about 35 MiB of tokenizer memory)
GROUP_PIECES = 4  # characters encoded in one call: at most this many pieces' worth


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Each text's token ids (int64, no special tokens)."""
    pieces, owners = [], []
    for owner, text in enumerate(texts):
        for piece in _pieces(text):
            pieces.append(piece)
            owners.append(owner)
    parts: list[list[np.ndarray]] = [[] for _ in texts]
    for group in _groups(pieces):
        encodings = tokenizer.encode_batch_fast([pieces[i] for i in group], add_special_tokens=False)
        for i, encoding in zip(group, encodings):
            parts[owners[i]].append(np.asarray(encoding.ids, dtype=np.int64))
    return [np.concatenate(ids) for ids in parts]


def _pieces(text: str) -> Iterator[str]:
    start = 0
    while len(text) - start > PIECE_CHARS:
        end = _cut(text, start + PIECE_CHARS // 2, start + PIECE_CHARS)
        yield text[start:end]
        start = end
    yield text[start:]


def _cut(text: str, low: int, limit: int) -> int:
    """The last position in ``(low, limit)`` just before a space followed by a non-space; else ``limit``."""
    cut = text.rfind(" ", low, limit)
    while cut > low and text[cut + 1].isspace():
        cut = text.rfind(" ", low, cut)
    return cut if cut > low else limit


def _groups(pieces: list[str]) -> Iterator[list[int]]:
    """Indices of consecutive pieces, at most ``GROUP_PIECES * PIECE_CHARS`` characters a group (one piece at least)."""
    group: list[int] = []
    chars = 0
    for i, piece in enumerate(pieces):
        if group and chars + len(piece) > GROUP_PIECES * PIECE_CHARS:
            yield group
            group, chars = [], 0
        group.append(i)
        chars += len(piece)
    if group:
        yield group
