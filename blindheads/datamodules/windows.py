"""Documents packed into token windows, in a fixed order, split across ranks and workers, resumable exactly.

Documents are tokenized, each followed by EOS, and concatenated. Window ``m`` holds tokens ``m*L .. m*L + L``
(``L + 1`` tokens: inputs and shifted targets), so consecutive windows share one token and every token is a target
exactly once.

Each DataLoader worker of each rank reads one *stream*: ``datasets.distributed.split_dataset_by_node`` with
``world_size * num_workers`` nodes, which gives whole files to streams when there are enough and every n-th
document otherwise, so streams are disjoint and together cover the source. Every window carries the position where
its stream goes on after it (and how many windows the stream has yielded, a clock that episode writers may use for
a curriculum); restarting a stream there reproduces the rest exactly. Training streams repeat the
data epoch after epoch, so every rank always has a next batch and training length is set by ``max_steps``.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from typing import Any

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from tokenizers import Tokenizer

from blindheads.datamodules.encoding import encode_documents
from blindheads.datamodules.retrieval_mix import EpisodeWriter
from blindheads.datamodules.task_format import TaskWriter

DOC_BATCH = 64  # documents tokenized together (the Rust tokenizer parallelises a batch)


def _start(epoch: int) -> dict[str, Any]:
    """A stream position: ``docs``, the ``datasets`` state before a batch of documents (``None`` at an epoch's
    start), then document ``doc`` of that batch and token ``offset`` of that document; ``window``, the windows the
    stream yielded before it (absent in checkpoints written before it existed: 0)."""
    return {"epoch": epoch, "docs": None, "doc": 0, "offset": 0, "window": 0}


class TokenWindows(torch.utils.data.IterableDataset):
    """Yields ``{"input_ids": LongTensor[seq_len + 1], "stream": int, "state": dict}``."""

    def __init__(
        self,
        documents: datasets.IterableDataset,
        tokenizer: Tokenizer,
        eos_id: int,
        seq_len: int,
        text_column: str = "text",
        *,
        rank: int = 0,
        world_size: int = 1,
        repeat: bool = True,
        resume: dict[str, Any] | None = None,
        episodes: EpisodeWriter | TaskWriter | None = None,
        files: tuple[str, ...] = (),
    ) -> None:
        self.documents, self.tokenizer, self.eos_id = documents, tokenizer, eos_id
        self.seq_len, self.text_column = seq_len, text_column
        self.rank, self.world_size, self.repeat = rank, world_size, repeat
        self.resume = resume or {"next_stream": 0, "streams": {}}
        self.episodes = episodes  # retrieval episodes mixed into the documents (training streams only)
        self.files = files  # the documents' files, to name one that disappears while training reads it

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        num_streams, worker = (info.num_workers, info.id) if info else (1, 0)
        # The DataLoader asks worker 0 first: rotate so the stream after the last one consumed comes first.
        stream = (worker + self.resume["next_stream"]) % num_streams
        docs = split_dataset_by_node(
            self.documents, rank=self.rank * num_streams + stream, world_size=self.world_size * num_streams
        )
        position = self.resume["streams"].get(stream, _start(0))
        for window, state in self._windows(docs, position):
            yield {"input_ids": window, "stream": stream, "state": state}

    def _document_batches(self, docs: datasets.IterableDataset, position: dict[str, Any]):
        """Yield ``(state before the batch, epoch, token arrays)``, starting at ``position``."""
        epoch, state = position["epoch"], position["docs"]
        skip_docs, skip_tokens = position["doc"], position["offset"]
        # the stream index of the next document's first token (a position is a window boundary)
        start = position.get("window", 0) * self.seq_len - skip_tokens
        while True:
            docs.set_epoch(epoch)
            if state is not None:
                docs.load_state_dict(state)
            empty = True
            for batch in _read(docs, self.files):
                empty = False
                texts = _checked_texts(batch[self.text_column], state)
                arrays = encode_documents(self.tokenizer, texts)
                if self.episodes is not None:
                    arrays, start = self._with_episodes(texts, arrays, epoch, start, first=skip_docs)
                arrays = [np.append(a, self.eos_id) for a in arrays]
                if skip_docs or skip_tokens:  # resuming inside this batch
                    arrays = (
                        [np.empty(0, np.int64)] * skip_docs
                        + [arrays[skip_docs][skip_tokens:]]
                        + arrays[skip_docs + 1 :]
                    )
                    skip_docs = skip_tokens = 0
                yield state, epoch, arrays
                state = docs.state_dict()  # already a copy
            if empty and state is None:
                raise ValueError(
                    "a data stream got no documents: the source is empty, or has fewer documents than ranks x workers"
                )
            if not self.repeat:
                return
            epoch, state = epoch + 1, None

    def _with_episodes(self, texts: list[str], arrays: list[np.ndarray], epoch: int, start: int, first: int):
        """Documents ``first`` onwards with their episodes; ``start`` follows each document's first token in the
        stream, so its window and place in that window (the episodes depend on both, so a resumed stream rebuilds the
        same documents)."""
        assert self.episodes is not None  # called for a stream with episodes only
        out = list(arrays)
        for i in range(first, len(arrays)):
            window, offset = divmod(start, self.seq_len)
            out[i] = self.episodes.insert(texts[i], arrays[i], epoch, offset, window=window)
            start += len(out[i]) + 1  # + 1: the EOS that follows
        return out, start

    def _windows(self, docs: datasets.IterableDataset, position: dict[str, Any]):
        span = self.seq_len
        buffer = np.empty(0, dtype=np.int64)
        starts: list[int] = []  # buffer index where each buffered document (or its resumed remainder) begins
        origins: list[dict[str, Any]] = []  # the stream position of that index
        pending_offset = position["offset"]  # the first document read may be a resumed remainder
        windows = position.get("window", 0)
        for state, epoch, arrays in self._document_batches(docs, position):
            end = len(buffer)
            for doc, tokens in enumerate(arrays):
                if len(tokens):
                    starts.append(end)
                    origins.append({"epoch": epoch, "docs": state, "doc": doc, "offset": pending_offset})
                    pending_offset, end = 0, end + len(tokens)
            buffer = np.concatenate([buffer, *arrays])
            emitted = 0
            while len(buffer) - emitted > span:
                window = torch.from_numpy(buffer[emitted : emitted + span + 1].copy())
                emitted, windows = emitted + span, windows + 1
                yield window, {**_position_at(starts, origins, emitted), "window": windows}
            if emitted:
                keep = bisect.bisect_right(starts, emitted) - 1
                origins = [_position_at(starts, origins, emitted), *origins[keep + 1 :]]
                starts = [0] + [s - emitted for s in starts[keep + 1 :]]
                buffer = buffer[emitted:]


def _read(docs: datasets.IterableDataset, files: tuple[str, ...]) -> Iterator[dict[str, list]]:
    """The stream's document batches; a reader error (bad bytes in a remote file) names where the stream was, and
    a local file deleted or moved since training started is named as such."""
    try:
        yield from docs.iter(batch_size=DOC_BATCH)
    except (UnicodeDecodeError, ValueError, OSError) as error:
        gone = [f for f in files if "://" not in f and not os.path.exists(f)]
        if gone:
            raise ValueError(
                f"data file {gone[0]} was deleted or moved while training read it"
                + (f" ({len(gone) - 1} more gone)" if len(gone) > 1 else "")
                + ": restore it, then resume with --ckpt_path last"
            ) from None
        raise ValueError(
            f"cannot read the documents after stream position {_where(docs.state_dict())}: {error}"
        ) from None


def _checked_texts(texts: list, state: dict[str, Any] | None) -> list[str]:
    """Every document's text must be a string (local files are checked before reading; remote ones here)."""
    for row, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(
                f"document {row} after stream position {_where(state)} has text "
                f"{type(text).__name__} {text!r:.60}, expected a string"
            )
    return texts


def _where(state: dict[str, Any] | None) -> str:
    """A ``datasets`` stream state as 'file (shard) k, row r' of this stream's shards."""
    while isinstance(state, dict) and "shard_idx" not in state:
        state = state.get("examples_iterable")
    return f"shard {state['shard_idx']}, row {state['shard_example_idx']}" if state else "start"


def _position_at(starts: list[int], origins: list[dict[str, Any]], index: int) -> dict[str, Any]:
    """The stream position of buffer index ``index``."""
    i = bisect.bisect_right(starts, index) - 1
    return {**origins[i], "offset": origins[i]["offset"] + index - starts[i]}


def collate_windows(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack a batch of windows (all from one stream, as each DataLoader worker builds whole batches) and keep the
    position after the last one."""
    return {
        "input_ids": torch.stack([w["input_ids"] for w in windows]),
        "stream": windows[-1]["stream"],
        "state": windows[-1]["state"],
    }
