"""Held-out retrieval-mix episodes as retrieval samples: the mix's templates over held-out text, at a fixed gap."""

from __future__ import annotations

import random

import torch

from blindheads.datamodules.retrieval_mix import EpisodeWriter, find
from blindheads.evaluation.prompts import RetrievalSample


def recall_samples(
    writer: EpisodeWriter, haystack: list[int], eos: int, length: int, gap: int, count: int, seed: int = 0
):
    """Held-out episodes of exactly ``length`` tokens over held-out text: ``[EOS]`` text, the facts, ``gap`` tokens of
    text, then the first recall, whose value is the answer. Returns ``(RetrievalSample, fact_at)`` pairs, ``fact_at``
    being where the recalled value starts in the facts (the answer's first token looks that far back, exactly)."""
    out = []
    for index in range(count):
        rng = random.Random(f"recall/{seed}/{length}/{gap}/{index}")
        _, facts, recalls, _ = writer.episode(rng, gap=gap)
        prefix, value = recalls[0]
        lead = length - 1 - len(facts) - gap - len(prefix) - len(value)
        if lead < 0:
            raise ValueError(f"recall samples of {length} tokens cannot hold a gap of {gap} tokens")
        offset = rng.randrange(max(1, len(haystack) - lead - gap))
        text = haystack[offset : offset + lead + gap]
        tokens = [eos, *text[:lead], *facts, *text[lead:], *prefix, *value]
        answer_start = length - len(value)
        fact_at = 1 + lead + find(facts, value)
        answer = writer.tokenizer.decode(value).strip()
        sample = RetrievalSample(length, 0.0, index, torch.tensor(tokens), answer_start, answer)
        out.append((sample, fact_at))
    return out
