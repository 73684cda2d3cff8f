"""Retrieval episodes mixed into natural text, so small models learn to retrieve within minutes of training.

An episode states ``facts`` key-value facts, lets ``gap`` tokens of the document's own text pass, then recalls
every fact in a shuffled order::

    ... The plum gimlet code reads 48213. The onyx wagon code reads 9051. <gap: the document's next tokens>
    So the onyx wagon code reads 9051. So the plum gimlet code reads 48213. <the rest of the document>

The gap is log-uniform in ``[min_gap, max_gap]`` tokens, and every episode lies inside one training window (its
start is drawn uniformly among the window positions where it fits), so the distance a head must look back is
controlled exactly: from each recalled value's first token back to the same value in its fact. A document that is
too short for the drawn gap carries no episode (``EpisodeWriter.statistics`` counts the realised rate).

Every choice comes from a generator seeded by (mix seed, epoch, the document's text), so a document gets the same
episode on any machine, world size and resume, and a different one each epoch. The templates, key words and value
ranges share nothing with the passkey and needle evaluation prompts (``tests/test_retrieval_mix.py`` checks it):
evaluation stays held out.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np

FACT = " The {key} code reads {value}."
RECALL = " So the {key} code reads"
KEY_WORDS = (
    ["plum", "cedar", "copper", "maple", "onyx", "ivory", "jade", "basalt", "coral", "indigo", "slate", "cobalt"],
    [
        "gimlet",
        "wagon",
        "kettle",
        "ledger",
        "mortar",
        "parcel",
        "quill",
        "rudder",
        "spindle",
        "trowel",
        "yoke",
        "easel",
    ],
)
VALUE_DIGITS = (3, 6)  # values of 3 to 6 digits (passkey uses 5, needle 7)


@dataclass(frozen=True)
class RetrievalMix:
    """Retrieval episodes inserted into the training stream (``FineWebEdu(retrieval_mix=...)``).

    ``rate``: the share of documents that carry an episode (where they are long enough); ``facts``: key-value
    facts per episode (more than one makes it associative recall: the key must be matched, not the last number);
    ``min_gap``/``max_gap``: the tokens of text between the facts and the recalls, log-uniform."""

    rate: float = 0.5
    facts: int = 2
    min_gap: int = 8
    max_gap: int = 160
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"retrieval_mix.rate must lie in [0, 1], got {self.rate}")
        if self.facts < 1:
            raise ValueError(f"retrieval_mix.facts must be >= 1, got {self.facts}")
        if not 1 <= self.min_gap <= self.max_gap:
            raise ValueError(f"retrieval_mix needs 1 <= min_gap <= max_gap, got {self.min_gap} and {self.max_gap}")


class EpisodeWriter:
    """Inserts episodes into token arrays of documents, for one tokenizer and window length."""

    def __init__(self, mix: RetrievalMix, tokenizer, seq_len: int) -> None:
        self.mix, self.tokenizer, self.seq_len = mix, tokenizer, seq_len
        # in this process: documents seen, episodes drawn and inserted, recall distances (tokens -> count)
        self.statistics = {"documents": 0, "drawn": 0, "episodes": 0, "distances": Counter()}
        longest = self._episode(random.Random(0), max_gap=mix.max_gap, longest=True)[0]
        if len(longest) > seq_len:
            raise ValueError(
                f"retrieval_mix.max_gap={mix.max_gap} makes episodes of up to {len(longest)} tokens, longer than a "
                f"training window (seq_len={seq_len}): such episodes could never be learned; lower max_gap"
            )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _episode(self, rng: random.Random, max_gap: int, longest: bool = False):
        """(facts tokens, recalls as [(prefix tokens, value tokens)], gap) for one episode."""
        keys: set[str] = set()
        while len(keys) < self.mix.facts:
            keys.add(f"{rng.choice(KEY_WORDS[0])} {rng.choice(KEY_WORDS[1])}")
        facts, recalls, values = [], [], set()
        for key in sorted(keys):
            value = ""
            while not value or value in values:  # distinct values: each recall has one fact to find
                digits = VALUE_DIGITS[1] if longest else rng.randint(*VALUE_DIGITS)
                value = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
            values.add(value)
            facts += self.encode(FACT.format(key=key, value=value))
            recalls.append((self.encode(RECALL.format(key=key)), self.encode(f" {value}")))
        rng.shuffle(recalls)
        low, high = math.log(self.mix.min_gap), math.log(max_gap)
        gap = max_gap if longest else round(math.exp(rng.uniform(low, high)))
        recall_tokens = [t for prefix, value in recalls for t in (*prefix, *value, *self.encode("."))]
        return facts + [0] * gap + recall_tokens, facts, recalls, gap

    def insert(self, text: str, tokens: np.ndarray, epoch: int, window_offset: int) -> np.ndarray:
        """``tokens`` of document ``text`` (which starts ``window_offset`` tokens into a training window), with an
        episode inserted when this document draws one and is long enough (counted in ``statistics``)."""
        self.statistics["documents"] += 1
        rng = random.Random(hashlib.sha256(f"{self.mix.seed}/{epoch}/{text}".encode()).hexdigest())
        if rng.random() >= self.mix.rate:
            return tokens
        self.statistics["drawn"] += 1
        template, facts, recalls, gap = self._episode(rng, self.mix.max_gap)
        position = rng.randint(0, self.seq_len - len(template))  # where in a window the episode starts
        start = (position - window_offset) % self.seq_len  # the first such place in this document
        if start + gap > len(tokens):
            return tokens
        self.statistics["episodes"] += 1
        for distance in self._distances(facts, recalls, gap):
            self.statistics["distances"][distance] += 1
        recall_tokens = np.asarray(template[len(facts) + gap :], dtype=np.int64)
        pieces = [tokens[:start], np.asarray(facts, dtype=np.int64), tokens[start : start + gap], recall_tokens]
        return np.concatenate([*pieces, tokens[start + gap :]])

    def _distances(self, facts: list[int], recalls: list, gap: int) -> list[int]:
        """For each recall, how far its value's first token lies after the same value in the facts (in tokens)."""
        distances, cursor = [], len(facts) + gap
        for prefix, value in recalls:
            answer_at = cursor + len(prefix)
            fact_at = _find(facts, value)
            distances.append(answer_at - fact_at)
            cursor = answer_at + len(value) + len(self.encode("."))
        return distances


def _find(haystack: list[int], needle: list[int]) -> int:
    for i in range(len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    raise ValueError("a recalled value is missing from its facts")
