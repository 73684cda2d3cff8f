"""Retrieval prompts built in token space, so their lengths are exact in the model's tokenizer.

A sample is ``[EOS] context... question answer``: the leading EOS is the document separator the models saw in
training (no BOS is spliced into the middle). The answer is tokenized as it appears in context, with its leading
space. Every random choice comes from a generator seeded by (task seed, length, depth, sample), so every
evaluation of every run, on any process, sees identical prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from torch import Tensor

from blindheads.prompt_layout import PromptBuilder, random_digits
from blindheads.prompt_texts import (
    NEEDLE,
    NEEDLE_KEY_WORDS,
    NEEDLE_QUESTION,
    PASSKEY_FILLER,
    PASSKEY_INSTRUCTION,
    PASSKEY_NEEDLE,
    PASSKEY_QUESTION,
    evaluation_value,
)


@dataclass(frozen=True)
class RetrievalSample:
    """One prompt: ``tokens`` (length exactly ``length``) ends with the answer, which starts at ``answer_start``."""

    length: int
    depth: float
    index: int
    tokens: Tensor
    answer_start: int
    answer: str

    @property
    def answer_tokens(self) -> Tensor:
        return self.tokens[self.answer_start :]


def sample_rng(seed: int, length: int, depth: float, index: int) -> random.Random:
    """A generator that depends only on its arguments (string seeds are hashed with SHA-512, not salted)."""
    return random.Random(f"{seed}/{length}/{depth:.6f}/{index}")


def evaluation_digits(rng: random.Random, digits: int) -> str:
    """A number of ``digits`` digits from the evaluation's half (``evaluation_value``): one training never teaches."""
    while not evaluation_value(value := random_digits(rng, digits)):
        pass
    return value


def passkey_samples(tokenizer, lengths: list[int], depths: list[float], samples: int, seed: int = 0, digits: int = 5):
    """The landmark-attention passkey task: instruction, filler, the pass-key line at ``depth``, question; keys of
    ``digits`` digits (5 in the original task)."""
    builder = PromptBuilder(tokenizer)
    head = builder.encode(PASSKEY_INSTRUCTION)
    unit = builder.encode(PASSKEY_FILLER)
    tail = builder.encode(PASSKEY_QUESTION)
    out = []
    for length in lengths:
        filler = unit * (length // max(1, len(unit)) + 1)
        for depth in depths:
            for index in range(samples):
                key = evaluation_digits(sample_rng(seed, length, depth, index), digits)
                needle = builder.encode(PASSKEY_NEEDLE.format(key=key))
                tokens, start = builder.assemble(
                    length, head, filler, [(depth, needle)], tail, builder.encode(f" {key}"), boundary=len(unit)
                )
                out.append(RetrievalSample(length, depth, index, tokens, start, key))
    return out


def needle_samples(
    tokenizer,
    haystack: list[int],
    lengths: list[int],
    depths: list[float],
    samples: int,
    distractors: int = 0,
    seed: int = 0,
    digits: int = 7,
):
    """RULER's single needle (a value of ``digits`` digits, 7 in RULER, for a two-word key) in natural held-out
    text, with optional distractor needles that give other keys other values at random depths."""
    builder = PromptBuilder(tokenizer)
    out = []
    for length in lengths:
        for depth in depths:
            for index in range(samples):
                rng = sample_rng(seed, length, depth, index)
                keys: set[str] = set()
                while len(keys) < distractors + 1:
                    keys.add(f"{rng.choice(NEEDLE_KEY_WORDS[0])}-{rng.choice(NEEDLE_KEY_WORDS[1])}")
                key, *others = sorted(keys)
                value = evaluation_digits(rng, digits)
                needles = [(depth, builder.encode(NEEDLE.format(key=key, value=value)))]
                for other in others:
                    fake = evaluation_digits(rng, digits)
                    needles.append((rng.random(), builder.encode(NEEDLE.format(key=other, value=fake))))
                offset = rng.randrange(max(1, len(haystack) - length))
                tokens, start = builder.assemble(
                    length,
                    [],
                    haystack[offset:],
                    needles,
                    builder.encode(NEEDLE_QUESTION.format(key=key)),
                    builder.encode(f" {value}"),
                )
                out.append(RetrievalSample(length, depth, index, tokens, start, value))
    return out
