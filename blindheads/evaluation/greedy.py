"""Greedy decoding and a string match: the evaluation an auditor would write, sharing no code with the scorer it
checks (``scoring.score_samples``, teacher-forced), so that an error in either shows as a disagreement between them.

From each sample's prompt (its tokens before the answer) the decoder's full forward logits (``decoder(input_ids)``,
no cache) give the next token by argmax, appended and fed back, for one token more than the answer has. The answer
is right when the generated text, its leading spaces stripped, starts with the value and the character after it (if
any) is not a digit: ``57`` is no answer to ``5``. For argmax decoding that is the teacher-forced verdict but where
the model spells the value in other tokens than the prompt's (the scorer compares tokens, this compares text).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from blindheads.evaluation.prompts import RetrievalSample


@dataclass(frozen=True)
class Greedy:
    sample: RetrievalSample
    generated: str  # the decoded continuation of the prompt, as generated
    exact: bool


def matches(generated: str, value: str) -> bool:
    """Whether ``generated``, leading spaces stripped, starts with ``value`` and does not go on with a digit."""
    text = generated.lstrip(" ")
    return text.startswith(value) and not text[len(value) : len(value) + 1].isdigit()


@torch.no_grad()
def greedy_samples(decoder, tokenizer, samples: list[RetrievalSample], batch_size: int = 16) -> list[Greedy]:
    """Each sample's greedy continuation, in the samples' order; prompts of equal length go through together."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, sample in enumerate(samples):
        groups[(sample.answer_start, len(sample.answer_tokens))].append(index)
    device = next(decoder.parameters()).device
    out: dict[int, Greedy] = {}
    for (prompt, answer), indices in groups.items():
        for i in range(0, len(indices), batch_size):
            batch = indices[i : i + batch_size]
            ids = torch.stack([samples[j].tokens[:prompt] for j in batch]).to(device)
            for _ in range(answer + 1):
                chosen = decoder(ids)[:, -1].argmax(-1)
                ids = torch.cat([ids, chosen[:, None]], dim=1)
            for row, j in enumerate(batch):
                text = tokenizer.decode(ids[row, prompt:].tolist())
                out[j] = Greedy(samples[j], text, matches(text, samples[j].answer))
    return [out[j] for j in range(len(samples))]
