"""Teacher-forced scoring: one forward pass per batch, no sampling.

At every answer position the argmax is compared with the answer token: all equal is an exact match (the same
verdict greedy decoding would give) and the decoded predictions give per-digit accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from blindheads.evaluation.prompts import RetrievalSample


@dataclass(frozen=True)
class Score:
    sample: RetrievalSample
    exact: bool
    digits: float  # share of answer characters the teacher-forced prediction gets right


@torch.no_grad()
def score_samples(decoder, tokenizer, samples: list[RetrievalSample], batch_size: int = 4) -> list[Score]:
    """Score samples of equal length together; only the answer positions go through the LM head."""
    by_length: dict[int, list[RetrievalSample]] = defaultdict(list)
    for sample in samples:
        by_length[sample.length].append(sample)
    device = next(decoder.parameters()).device
    scores = []
    for length, group in by_length.items():
        for i in range(0, len(group), batch_size):
            batch = group[i : i + batch_size]
            hidden = decoder.hidden_states(torch.stack([s.tokens for s in batch]).to(device))
            for row, sample in enumerate(batch):
                positions = torch.arange(sample.answer_start - 1, length - 1, device=device)
                predicted = decoder.lm_head(hidden[row, positions]).argmax(-1).cpu()
                exact = bool(torch.equal(predicted, sample.answer_tokens))
                text = tokenizer.decode(predicted.tolist()).strip()
                digits = sum(a == b for a, b in zip(text, sample.answer)) / len(sample.answer)
                scores.append(Score(sample, exact, digits))
    return scores


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
