"""How a retrieval prompt is laid out in token space, shared by the evaluation's prompts and the training windows made
in their format (``datamodules/task_format.py``), so both build a prompt of a length the same way."""

from __future__ import annotations

import random

import torch
from torch import Tensor


class PromptBuilder:
    """Token pieces of one tokenizer, encoded without special tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def assemble(
        self,
        length: int,
        head: list[int],
        haystack: list[int],
        needles: list[tuple[float, list[int]]],
        tail: list[int],
        answer: list[int],
        boundary: int = 1,
    ) -> tuple[Tensor, int]:
        """``[EOS] head haystack-with-needles tail answer`` of exactly ``length`` tokens. Each needle goes at its
        depth (a fraction of the haystack), moved back to a multiple of ``boundary`` tokens (a filler sentence)."""
        fixed = 1 + len(head) + sum(len(n) for _, n in needles) + len(tail) + len(answer)
        room = length - fixed
        if room < 0:
            raise ValueError(f"a prompt of {length} tokens is too short: its fixed parts alone take {fixed} tokens")
        if len(haystack) < room:
            raise ValueError(f"the haystack has {len(haystack)} tokens, {room} are needed for length {length}")
        body = list(haystack[:room])
        for depth, needle in sorted(needles, key=lambda item: -item[0]):  # deepest first keeps earlier offsets valid
            at = int(depth * room) // boundary * boundary
            body[at:at] = needle
        tokens = [self.eos, *head, *body, *tail, *answer]
        return torch.tensor(tokens, dtype=torch.long), length - len(answer)


def random_digits(rng: random.Random, digits: int) -> str:
    """A number of exactly ``digits`` digits (no leading zero)."""
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))
