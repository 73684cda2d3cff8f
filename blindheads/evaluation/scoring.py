"""Teacher-forced scoring: one forward pass per batch, no sampling.

At every answer position the argmax is compared with the answer token, and the argmax after the answer's last token
must not go on with the number (a digit with no space before it: ``57`` is no answer to ``5``): both hold for an
exact match, the verdict greedy decoding and a string match would give. The decoded predictions give per-digit
accuracy, and how constant a model's answers are.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from blindheads.evaluation.prompts import RetrievalSample


@dataclass(frozen=True)
class Score:
    sample: RetrievalSample
    exact: bool  # every answer token predicted, then no digit that would lengthen the number
    digits: float  # share of answer characters the teacher-forced prediction gets right
    predicted: str  # the teacher-forced answer, as text


@torch.no_grad()
def score_samples(decoder, tokenizer, samples: list[RetrievalSample], batch_size: int = 4) -> list[Score]:
    """Score samples of equal length together; only the answer positions go through the LM head. The scores are in
    the order of ``samples`` (so they pair with anything else measured per episode)."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for index, sample in enumerate(samples):
        by_length[sample.length].append(index)
    device = next(decoder.parameters()).device
    scores: list[Score | None] = [None] * len(samples)
    for length, group in by_length.items():
        for i in range(0, len(group), batch_size):
            indices = group[i : i + batch_size]
            batch = [samples[j] for j in indices]
            hidden = decoder.hidden_states(torch.stack([s.tokens for s in batch]).to(device))
            for row, (index, sample) in enumerate(zip(indices, batch)):
                positions = torch.arange(sample.answer_start - 1, length, device=device)  # the answer, then after it
                *predicted, after = decoder.lm_head(hidden[row, positions]).argmax(-1).tolist()
                ends = not tokenizer.decode([after])[:1].isdigit()
                exact = predicted == sample.answer_tokens.tolist() and ends
                text = tokenizer.decode(predicted).strip()
                digits = sum(a == b for a, b in zip(text, sample.answer)) / len(sample.answer)
                scores[index] = Score(sample, exact, digits, text)
    return [score for score in scores if score is not None]


def top_share(values: Iterable) -> float:
    """The share of the most common value: among the answers, the score of always giving the most common one (the
    baseline an accuracy must beat); among the predictions, how constant a model's answers are."""
    counts = Counter(values)
    return max(counts.values()) / counts.total()


@torch.no_grad()
def token_losses(decoder, tokens: Tensor, chunk: int = 1024) -> Tensor:
    """Next-token losses (batch, length - 1), with the LM head applied in chunks of positions."""
    hidden = decoder.hidden_states(tokens[:, :-1])
    targets = tokens[:, 1:]
    losses = [
        F.cross_entropy(
            decoder.lm_head(hidden[:, i : i + chunk]).float().transpose(1, 2),
            targets[:, i : i + chunk],
            reduction="none",
        )
        for i in range(0, hidden.shape[1], chunk)
    ]
    return torch.cat(losses, dim=1)
