"""Held-out retrieval-mix episodes as retrieval samples: the mix's templates over held-out text, at a fixed gap or
at a fixed answer distance (which may lie beyond the training window).

Training sets every episode inside one document, so no EOS ever lies between a fact and its recall. Held-out
documents are often shorter than the farthest distances (8x a 1,024-token window is 8,192 tokens), so the episodes'
text is the held-out stream with its EOS tokens removed: one unbroken text, as a document is in training, at any
distance and without favouring the few long documents."""

from __future__ import annotations

import hashlib
import json
import random
from typing import NamedTuple

import torch

from blindheads.datamodules.retrieval_mix import EpisodeWriter, find
from blindheads.evaluation.prompts import RetrievalSample


class Episode(NamedTuple):
    """A held-out episode: its sample, and where the recalled value's first content token lies in the fact
    (``fact``) and in the answer (``answer``). A value the tokenizer splits into a space token and its digits starts
    at its first digit: the space is the template's, the same in every episode, and says nothing about the value."""

    sample: RetrievalSample
    fact: int
    answer: int

    @property
    def distance(self) -> int:
        return self.answer - self.fact


def recall_samples(
    writer: EpisodeWriter,
    haystack: list[int],
    eos: int,
    length: int,
    count: int,
    gap: int | None = None,
    distance: int | None = None,
    seed: int = 0,
) -> list[Episode]:
    """``count`` held-out episodes over held-out text: ``[EOS]`` text, the facts, a gap of text, then the first
    recall, whose value is the answer. Give exactly one of ``gap`` (tokens of text between facts and recall) or
    ``distance`` (how far the answer's first content token lies after its fact's: the gap is chosen per episode to
    make it exact). ``seed`` draws the episodes: the same seed, the same episodes.

    A sample is ``length`` tokens long, or where the episode needs more (a distance beyond the window) exactly as
    long as it needs."""
    if (gap is None) == (distance is None):
        raise ValueError(f"give exactly one of gap and distance, got gap={gap}, distance={distance}")
    text_tokens = writer.filler(haystack)
    haystack = text_tokens[text_tokens != eos].tolist()  # one unbroken text, as in training (module docstring)
    out = []
    for index in range(count):
        point = gap if distance is None else f"distance{distance}"
        rng = random.Random(f"recall/{seed}/{length}/{point}/{index}")
        _, facts, recalls, _ = writer.episode(rng, gap=gap or 1)
        prefix, value = recalls[0]
        fact_in_facts = find(facts, value)
        if distance is None:
            assert gap is not None  # exactly one of gap and distance is given (checked above)
            episode_gap = gap
        else:
            episode_gap = distance - (len(facts) - fact_in_facts) - len(prefix)
        if episode_gap < 1:
            if distance is None:  # a gap given below 1
                raise ValueError(f"recall episodes need a gap >= 1, got {gap}")
            raise ValueError(f"recall episodes cannot put an answer {distance} tokens after its fact: the shortest is "
                             f"{distance - episode_gap + 1}")  # fmt: skip
        needed = 1 + len(facts) + episode_gap + len(prefix) + len(value)
        if distance is None and needed > length:
            raise ValueError(f"recall samples of {length} tokens cannot hold a gap of {gap} tokens")
        total = max(length, needed)
        lead = total - needed
        if len(haystack) < lead + episode_gap:
            raise ValueError(f"a haystack of {len(haystack)} tokens is too short for {lead + episode_gap} of text")
        offset = rng.randrange(max(1, len(haystack) - lead - episode_gap))
        text = haystack[offset : offset + lead + episode_gap]
        tokens = [eos, *text[:lead], *facts, *text[lead:], *prefix, *value]
        answer_start, blank = total - len(value), blank_lead(writer.tokenizer, value)
        answer = writer.tokenizer.decode(value).strip()
        sample = RetrievalSample(total, 0.0, index, torch.tensor(tokens), answer_start, answer)
        out.append(Episode(sample, 1 + lead + fact_in_facts + blank, answer_start + blank))
    return out


def blank_lead(tokenizer, value: list[int]) -> int:
    """How many of ``value``'s first tokens are only whitespace (a space the tokenizer keeps apart from a digit)."""
    blank = 0
    while blank < len(value) - 1 and not tokenizer.decode(value[: blank + 1]).strip():
        blank += 1
    return blank


def retrieval_episode(tokenizer, sample: RetrievalSample) -> Episode:
    """A passkey or needle prompt as an episode: its fact is the last copy of the answer in the context (the
    passkey's needle holds the key twice; the nearer copy is the one a head goes blind to last)."""
    value = sample.answer_tokens.tolist()
    context = sample.tokens[: sample.answer_start].tolist()
    starts = [i for i in range(len(context) - len(value) + 1) if context[i : i + len(value)] == value]
    if not starts:
        raise ValueError(f"the answer {sample.answer!r} is not in its prompt's context")
    blank = blank_lead(tokenizer, value)
    return Episode(sample, starts[-1] + blank, sample.answer_start + blank)


def episode_set(episodes: list[Episode]) -> str:
    """The sha256 of the episodes' token ids, in order: two runs saw the same episodes exactly when it agrees."""
    return hashlib.sha256(json.dumps([e.sample.tokens.tolist() for e in episodes]).encode()).hexdigest()
