"""Training windows in the passkey and needle prompts' own format: the evaluation's tasks made in-distribution.

With these, passkey and needle scores measure how far a model trained on the task reaches (at and beyond its
training length, with or without blind heads), not whether retrieval emerges from ordinary text. Every training
window is ``[EOS] sequence [EOS] sequence ...`` (one or two sequences filling it), and each sequence is laid out by
the evaluation's own ``PromptBuilder.assemble`` exactly as a prompt of its length, its EOS included, so even absolute
positions match a held-out prompt:

- passkey: the instruction, filler, `` The pass key is {k}. Remember it. {k} is the pass key.`` at a depth, filler,
  `` What is the pass key? The pass key is`` and `` {k}`` (5 digits). The filler is the standard sentences in half the
  sequences (the needle at a sentence boundary, as evaluated) and the training document's own text in the others.
- needle: RULER's `` One of the special magic numbers for {key} is: {value}.`` in the document's text, then its
  question and the value.

Held out: a key or value is drawn only where ``prompt_texts.evaluation_value`` says it is not the evaluation's, and
corpus filler is the training document's text (the evaluation's haystacks come from the held-out files).

Curriculum: the filler between the needle and the question is at most ``start_distance`` tokens at first; the limit
rises linearly to the whole sequence over the first ``ramp_windows`` training windows (all ranks and workers
together), counted by the stream itself (``windows.py`` keeps its window count in the resume position), so a resumed
run draws what the uninterrupted one did.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from blindheads import prompt_texts as texts
from blindheads.prompt_layout import PromptBuilder, random_digits


@dataclass(frozen=True)
class TaskFormat:
    """Passkey and needle training sequences (``TextData(task_format=...)``, instead of ``retrieval_mix``).

    ``needle``: the share of sequences that are needles (the rest passkeys); ``corpus_filler``: the share of passkey
    sequences whose filler is the document's text, not the standard sentences; ``min_filler``: the fewest filler
    tokens a sequence has (so the shortest sequence is its fixed parts plus these)."""

    needle: float = 0.25
    corpus_filler: float = 0.5
    key_digits: int = 5  # the passkey's (the landmark-attention task's 5)
    needle_digits: int = 7  # RULER's
    min_filler: int = 8
    start_distance: int = 16
    ramp_windows: int = 3200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("needle", "corpus_filler"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"task_format.{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.key_digits < 1 or self.needle_digits < 1:
            raise ValueError(f"task_format digits must be >= 1, got {self.key_digits} and {self.needle_digits}")
        if self.min_filler < 0 or self.start_distance < 0 or self.ramp_windows < 0:
            raise ValueError("task_format.min_filler, start_distance and ramp_windows must be >= 0")


class TaskWriter:
    """Turns each training document into whole windows of task sequences, its text their corpus filler."""

    def __init__(self, task: TaskFormat, tokenizer, seq_len: int, streams: int = 1) -> None:
        """``tokenizer``: the transformers tokenizer the evaluation encodes with; ``streams``: ranks x workers, whose
        windows together make the curriculum's clock."""
        self.task, self.seq_len, self.streams = task, seq_len, streams
        self.builder = PromptBuilder(tokenizer)
        self.eos = self.builder.eos
        encode = self.builder.encode
        self.head, self.unit, self.tail = (
            encode(texts.PASSKEY_INSTRUCTION),
            encode(texts.PASSKEY_FILLER),
            encode(texts.PASSKEY_QUESTION),
        )
        # in this process: windows written, sequences by task and filler, filler tokens between needle and question
        self.statistics: dict[str, Any] = {"windows": 0, "sequences": Counter(), "distances": Counter()}
        # the longest fixed parts a sequence has (+ 1: its EOS) with all-nines values (with some vocabularies another
        # value takes a token or two more: ``min_filler`` makes room, ``sequence`` redraws where it does not)
        nines = ("9" * task.key_digits, "9" * task.needle_digits)
        passkey = 1 + len(self.head) + len(encode(texts.PASSKEY_NEEDLE.format(key=nines[0]))) + len(self.tail)
        needle = 1 + max(
            len(encode(texts.NEEDLE.format(key=key, value=nines[1])))
            + len(encode(texts.NEEDLE_QUESTION.format(key=key)))
            for key in needle_keys()
        )
        self.shortest = max(passkey + len(encode(f" {nines[0]}")), needle + len(encode(f" {nines[1]}")))
        self.shortest += task.min_filler
        if self.shortest > seq_len:
            raise ValueError(
                f"task_format sequences need at least {self.shortest} tokens (with min_filler={task.min_filler}), "
                f"more than a training window (seq_len={seq_len})"
            )

    def reach(self, window: int) -> int:
        """The most filler tokens between needle and question in the stream's window ``window``."""
        task = self.task
        progress = 1.0 if task.ramp_windows == 0 else min(1.0, max(0, window) * self.streams / task.ramp_windows)
        return math.floor(task.start_distance + progress * (self.seq_len - task.start_distance))

    def value(self, rng: random.Random, digits: int) -> str:
        """A number of ``digits`` digits that the evaluation never asks for."""
        while texts.evaluation_value(value := random_digits(rng, digits)):
            pass
        return value

    def insert(self, text: str, tokens: np.ndarray, epoch: int, window_offset: int, window: int = 0) -> np.ndarray:
        """Document ``text`` (``tokens``, starting ``window_offset`` tokens into the stream's window ``window``) as
        whole windows of sequences, as many as its text would have filled (at least one); its text is their corpus
        filler, read on from sequence to sequence and from its start again where one needs more."""
        if not len(tokens):
            return np.asarray(tokens, dtype=np.int64)
        rng = random.Random(hashlib.sha256(f"{self.task.seed}/{epoch}/{window}/{text}".encode()).hexdigest())
        used = 0

        def corpus(count: int) -> list[int]:
            nonlocal used
            taken = tokens[(used + np.arange(count)) % len(tokens)].tolist()
            used += count
            return taken

        out: list[list[int]] = []
        cursor, count = window_offset, max(1, math.ceil((window_offset + len(tokens)) / self.seq_len))
        if cursor == 0:  # the stream's first token: no EOS before it yet
            out.append([self.eos])
            cursor = 1
        for index in range(window, window + count):
            if index > window:
                out.append([self.eos])  # the window's last token, the next one's first
            out += self._window(rng, self.seq_len - cursor, corpus, self.reach(index))
            cursor = 1
        return np.asarray([t for piece in out for t in piece], dtype=np.int64)

    def _window(self, rng: random.Random, room: int, corpus: Callable[[int], list[int]], reach: int):
        """Sequences separated by EOS filling ``room`` tokens (plain text where it is too little for one)."""
        self.statistics["windows"] += 1
        pieces = []
        while room >= self.shortest:
            length = rng.randint(self.shortest, room)
            if room - length - 1 < self.shortest:
                length = room
            pieces.append(self.sequence(rng, length, corpus, reach))
            room -= length
            if room:
                pieces.append([self.eos])
                room -= 1
        if room:
            pieces.append(corpus(room))
        return pieces

    def sequence(self, rng: random.Random, length: int, corpus: Callable[[int], list[int]], reach: int) -> list[int]:
        """One passkey or needle sequence of ``length`` tokens after its EOS, at most ``reach`` filler tokens between
        the needle and the question."""
        encode = self.builder.encode
        room = -1  # the filler's tokens; a value whose digits take more tokens than ``shortest`` allowed is redrawn
        while room < 0:
            if rng.random() < self.task.needle:
                key = f"{rng.choice(texts.NEEDLE_KEY_WORDS[0])}-{rng.choice(texts.NEEDLE_KEY_WORDS[1])}"
                value = self.value(rng, self.task.needle_digits)
                head, needle = [], encode(texts.NEEDLE.format(key=key, value=value))
                tail = encode(texts.NEEDLE_QUESTION.format(key=key))
                kind = "needle"
            else:
                value = self.value(rng, self.task.key_digits)
                head, needle, tail = self.head, encode(texts.PASSKEY_NEEDLE.format(key=value)), self.tail
                kind = "passkey/corpus" if rng.random() < self.task.corpus_filler else "passkey"
            answer = encode(f" {value}")
            room = length - (len(head) + len(needle) + len(tail) + len(answer))
        boundary = len(self.unit) if kind == "passkey" else 1
        haystack = self.unit * (room // len(self.unit) + 1) if kind == "passkey" else corpus(room)
        # back to a sentence's start, as the evaluation places it
        at = (room - rng.randint(0, min(room, reach))) // boundary * boundary
        depth = (at + 0.5) / room if room else 0.0  # ``assemble`` puts it at int(depth * room): ``at`` exactly
        tokens, _ = self.builder.assemble(length + 1, head, haystack, [(depth, needle)], tail, answer, boundary)
        self.statistics["sequences"][kind] += 1
        self.statistics["distances"][room - at] += 1
        return tokens[1:].tolist()


def needle_keys() -> list[str]:
    """Every key the needle prompt can name (``amber-anchor``, ...)."""
    return [f"{first}-{second}" for first in texts.NEEDLE_KEY_WORDS[0] for second in texts.NEEDLE_KEY_WORDS[1]]
