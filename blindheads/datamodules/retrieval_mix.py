"""Retrieval episodes mixed into natural text, so small models learn to retrieve within minutes of training.

An episode states ``facts`` key-value facts, lets ``gap`` tokens of the document's own text pass, then recalls
every fact in a shuffled order. The ``sentence`` template::

    ... The plum gimlet code reads 48213. The onyx wagon code reads 9051. <gap: the document's next tokens>
    So the onyx wagon code reads 9051. So the plum gimlet code reads 48213. <the rest of the document>

the ``short`` one, whose answers lie only a few tokens beyond the gap (``wagon = 9051.`` ... ``wagon = 9051.``), and
the ``quiz`` one, the passkey task's shape in other words, keyed by two words of the tokenizer's vocabulary (``The
returned block is 42. Keep it in mind. 42 is the returned block.`` ... ``Question: which is the returned block? The
returned block is 42.``).

Each training window a document covers gets an episode with probability ``rate``. The gap is log-uniform in
``[min_gap, max_gap]`` tokens, and every episode lies inside one window (its start is drawn uniformly among the
positions where it fits after the document's start), so the distance a head must look back is controlled exactly:
from each recalled value's first token back to the same value in its fact. Where a document ends before the gap
does, that window gets none (``EpisodeWriter.statistics`` counts the realised rate and distances).

Every choice comes from a generator seeded by (mix seed, epoch, the document's text) and the window position the
document starts at, so a document gets the same episodes on any machine and resume, and new ones each epoch. The templates, key words and value
ranges share nothing with the passkey and needle evaluation prompts (``tests/test_retrieval_mix.py`` checks it):
evaluation stays held out.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from blindheads.prompt_texts import held_out_words

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
VOCABULARY = "vocabulary"  # a key word list: the tokenizer's whole-word tokens, none of them in an evaluation prompt
# template name -> (fact, recall, the word lists a key takes one word from each of)
TEMPLATES = {
    "sentence": (" The {key} code reads {value}.", " So the {key} code reads", KEY_WORDS),
    "short": (" {key} = {value}.", " {key} =", KEY_WORDS[1:]),
    # ``short`` with each value's digits as they are: no space before them, which a small vocabulary merges with
    # some digits only (`` 2`` one token, `` 7`` two), so one-digit answers are each one token
    "assign": (" {key}={value};", " {key}=", KEY_WORDS[1:]),
    # the shape of the passkey task (a value stated twice, a question, the answer's lead-in) in other words, its key
    # two words of the tokenizer's own (``The returned block is 42``): no fixed word marks the value, so the key
    # phrase itself must be matched, as in passkey
    "quiz": (
        " The {key} is {value}. Keep it in mind. {value} is the {key}.",
        " Question: which is the {key}? The {key} is",
        (VOCABULARY, VOCABULARY),
    ),
}


@dataclass(frozen=True)
class RetrievalMix:
    """Retrieval episodes inserted into the training stream (``TextData(retrieval_mix=...)``).

    ``rate``: the probability that a window a document covers gets an episode (so up to ``rate`` episodes per
    training window; fewer where a document ends first, see ``EpisodeWriter.statistics``); ``facts``: key-value
    facts per episode (more than one makes it associative recall: the key must be matched, not the last number);
    ``min_gap``/``max_gap``: the tokens of text between the facts and the recalls, log-uniform."""

    rate: float = 0.5
    facts: int = 2
    min_gap: int = 8
    max_gap: int = 160
    value_digits: tuple[int, int] = (3, 6)  # values of 3 to 6 digits (passkey uses 5, needle 7)
    seed: int = 0
    template: str = "sentence"  # "short"/"assign": one-word keys, ``key = value.``; "quiz": the passkey task's shape
    # False: the text's tokens that hold a digit are dropped, so a fact's value is the only number around it and a
    # head that sees it can recall it without matching its key (the conjecture isolates seeing from matching)
    filler_digits: bool = True

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ValueError(f"retrieval_mix.template must be one of {', '.join(TEMPLATES)}, got {self.template!r}")
        lists = TEMPLATES[self.template][2]  # vocabulary keys are counted by EpisodeWriter, which has the tokenizer
        if VOCABULARY not in lists and self.facts > (keys := math.prod(map(len, lists))):
            raise ValueError(f"retrieval_mix.facts={self.facts}: the {self.template} template has only {keys} keys")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"retrieval_mix.rate must lie in [0, 1], got {self.rate}")
        if self.facts < 1:
            raise ValueError(f"retrieval_mix.facts must be >= 1, got {self.facts}")
        if not 1 <= self.value_digits[0] <= self.value_digits[1]:
            raise ValueError(
                f"retrieval_mix.value_digits must be (min, max) with 1 <= min <= max, got {self.value_digits}"
            )
        if not 1 <= self.min_gap <= self.max_gap:
            raise ValueError(f"retrieval_mix needs 1 <= min_gap <= max_gap, got {self.min_gap} and {self.max_gap}")


class EpisodeWriter:
    """Inserts episodes into token arrays of documents, for one tokenizer and window length."""

    def __init__(self, mix: RetrievalMix, tokenizer, seq_len: int) -> None:
        self.mix, self.tokenizer, self.seq_len = mix, tokenizer, seq_len
        # in this process: window slots the documents covered, episodes drawn and inserted, recall distances
        self.statistics: dict[str, Any] = {"windows": 0, "drawn": 0, "episodes": 0, "distances": Counter()}
        vocab = tokenizer.get_vocab()
        digits = [] if mix.filler_digits else [i for t, i in vocab.items() if any(c.isdigit() for c in t)]
        self._digit_tokens = np.asarray(sorted(digits), dtype=np.int64)
        self.key_words = [vocabulary_words(vocab) if w == VOCABULARY else w for w in TEMPLATES[mix.template][2]]
        if not all(self.key_words):
            raise ValueError(
                f"the {mix.template} template keys episodes with whole-word tokens of a byte-level vocabulary "
                "(a leading \u0120 and at least three lower-case letters); this tokenizer has none"
            )
        longest = self.episode(random.Random(0), longest=True)[0]
        if len(longest) > seq_len:
            raise ValueError(
                f"retrieval_mix.max_gap={mix.max_gap} makes episodes of up to {len(longest)} tokens, longer than a "
                f"training window (seq_len={seq_len}): such episodes could never be learned; lower max_gap"
            )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def filler(self, tokens: npt.ArrayLike) -> np.ndarray:
        """The text tokens episodes are set in: ``tokens``, without those holding a digit unless ``filler_digits``."""
        tokens = np.asarray(tokens, dtype=np.int64)
        return tokens if self.mix.filler_digits else tokens[~np.isin(tokens, self._digit_tokens)]

    def episode(self, rng: random.Random, gap: int | None = None, longest: bool = False):
        """(template with the gap as zeros, facts tokens, recalls as [(prefix tokens, value tokens)], gap)."""
        fact, recall, _ = TEMPLATES[self.mix.template]
        lead = " " if " {value}" in fact else ""  # a recalled value's text as the fact states it
        keys: set[str] = set()
        while len(keys) < self.mix.facts:
            keys.add(" ".join(rng.choice(words) for words in self.key_words))
        facts, recalls, values = [], [], set()
        for key in sorted(keys):
            value = ""
            while not value or value in values:  # distinct values: each recall has one fact to find
                digits = self.mix.value_digits[1] if longest else rng.randint(*self.mix.value_digits)
                value = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
            values.add(value)
            facts += self.encode(fact.format(key=key, value=value))
            recalls.append((self.encode(recall.format(key=key)), self.encode(f"{lead}{value}")))
        rng.shuffle(recalls)
        low, high = math.log(self.mix.min_gap), math.log(self.mix.max_gap)
        if gap is None:
            gap = self.mix.max_gap if longest else round(math.exp(rng.uniform(low, high)))
        recall_tokens = [t for prefix, value in recalls for t in (*prefix, *value, *self.encode("."))]
        return facts + [0] * gap + recall_tokens, facts, recalls, gap

    def insert(self, text: str, tokens: np.ndarray, epoch: int, window_offset: int, window: int = 0) -> np.ndarray:
        """``tokens`` of document ``text`` (which starts ``window_offset`` tokens into a training window), with an
        episode in each window it covers with probability ``rate``, where the episode fits after the document's
        start and the document has text enough for its gap (all counted in ``statistics``). ``window``, the stream's
        window index, is unused: these episodes stay the same over training (``task_format.py``'s ramp up)."""
        rng = random.Random(hashlib.sha256(f"{self.mix.seed}/{epoch}/{text}".encode()).hexdigest())
        tokens = self.filler(tokens)
        size, out, taken, cursor = self.seq_len, [], 0, window_offset
        while taken < len(tokens):
            self.statistics["windows"] += 1
            if rng.random() < self.mix.rate:
                self.statistics["drawn"] += 1
                template, facts, recalls, gap = self.episode(rng)
                if cursor <= size - len(template):
                    lead = rng.randint(cursor, size - len(template)) - cursor  # text before it in this window
                    if taken + lead + gap <= len(tokens):
                        self._count(facts, recalls, gap)
                        out += [tokens[taken : taken + lead], np.asarray(facts, dtype=np.int64)]
                        out += [tokens[taken + lead : taken + lead + gap], np.asarray(template[len(facts) + gap :])]
                        taken, cursor = taken + lead + gap, cursor + lead + len(template)
            rest = min(size - cursor, len(tokens) - taken)  # the window's remaining text
            out.append(tokens[taken : taken + rest])
            taken, cursor = taken + rest, (cursor + rest) % size
        return np.concatenate(out).astype(np.int64) if out else tokens

    def _count(self, facts: list[int], recalls: list, gap: int) -> None:
        self.statistics["episodes"] += 1
        for distance in self.distances(facts, recalls, gap):
            self.statistics["distances"][distance] += 1

    def distances(self, facts: list[int], recalls: list, gap: int) -> list[int]:
        """For each recall, how far its value's first token lies after the same value in the facts (in tokens)."""
        distances, cursor = [], len(facts) + gap
        for prefix, value in recalls:
            answer_at = cursor + len(prefix)
            fact_at = find(facts, value)
            distances.append(answer_at - fact_at)
            cursor = answer_at + len(value) + len(self.encode("."))
        return distances


def vocabulary_words(vocab: dict[str, int]) -> list[str]:
    """The lower-case whole words of at least three letters that a byte-level vocabulary holds as one token with its
    leading space, less every word of the passkey and needle prompts (which stay held out)."""
    words = {t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isalpha() and t[1:].islower() and len(t) > 3}
    return sorted(words - held_out_words())


def find(haystack: list[int], needle: list[int]) -> int:
    """Where ``needle`` first starts in ``haystack``."""
    for i in range(len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    raise ValueError("a recalled value is missing from its facts")
