"""Held-out retrieval-mix episodes as retrieval samples: the mix's templates over held-out text, at a fixed gap or
at a fixed answer distance (which may lie beyond the training window)."""

from __future__ import annotations

import random

import torch

from blindheads.datamodules.retrieval_mix import EpisodeWriter, find
from blindheads.evaluation.prompts import RetrievalSample


def recall_samples(
    writer: EpisodeWriter,
    haystack: list[int],
    eos: int,
    length: int,
    count: int,
    gap: int | None = None,
    distance: int | None = None,
    seed: int = 0,
):
    """Held-out episodes over held-out text: ``[EOS]`` text, the facts, a gap of text, then the first recall, whose
    value is the answer. Give exactly one of ``gap`` (tokens of text between facts and recall) or ``distance`` (how
    far the answer's first token lies after its fact's value: the gap is chosen per episode to make it exact).

    A sample is ``length`` tokens long, or where the episode needs more (a distance beyond the window) exactly as
    long as it needs. Returns ``(RetrievalSample, fact_at)`` pairs, ``fact_at`` being where the recalled value
    starts in the facts."""
    if (gap is None) == (distance is None):
        raise ValueError(f"give exactly one of gap and distance, got gap={gap}, distance={distance}")
    out, haystack = [], writer.filler(haystack).tolist()
    for index in range(count):
        point = gap if distance is None else f"distance{distance}"
        rng = random.Random(f"recall/{seed}/{length}/{point}/{index}")
        _, facts, recalls, _ = writer.episode(rng, gap=gap or 1)
        prefix, value = recalls[0]
        fact_in_facts = find(facts, value)
        episode_gap = gap if distance is None else distance - (len(facts) - fact_in_facts) - len(prefix)
        if episode_gap < 1:
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
        answer_start = total - len(value)
        fact_at = 1 + lead + fact_in_facts
        answer = writer.tokenizer.decode(value).strip()
        sample = RetrievalSample(total, 0.0, index, torch.tensor(tokens), answer_start, answer)
        out.append((sample, fact_at))
    return out
