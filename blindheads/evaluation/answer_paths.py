"""Can an answer's query see its fact at all? What separates blindness from out-of-context degradation.

A fact is **blind** to its answer when every layer-head gives it exactly zero weight from the answer's query. It is
**unreachable** when no chain of non-zero weights links the two: layer 0 carries the fact to the tokens that give it
weight, layer 1 carries those on, and so on (the residual stream keeps what each token already holds). Through an
unreachable fact no information reaches the answer and no gradient flows back: a model cannot learn to use it. A
wrong answer whose fact was reachable failed for another reason (a position it never trained at, say).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from blindheads.evaluation.contexts import forward_hooks


@dataclass(frozen=True)
class AnswerPaths:
    weights: Tensor  # (episodes, layers, heads): the weight from each answer's query to its fact, as computed
    reachable: Tensor  # (episodes,) bool: some chain of non-zero weights links the fact to the answer's query

    @property
    def blind(self) -> Tensor:
        """(episodes,) bool: every layer-head weight from the answer's query to the fact is exactly zero."""
        return (self.weights == 0).flatten(1).all(1)


@torch.no_grad()
def answer_paths(
    decoder, tokens: Tensor, queries: Tensor, facts: Tensor, softmax_dtype: torch.dtype | None = None
) -> AnswerPaths:
    """For token rows ``tokens`` (batch, length) and positions ``queries``, ``facts`` (batch,): one forward pass
    with the eager backend, its softmax in ``softmax_dtype`` (the training precision's; else the model's)."""
    rows = torch.arange(len(tokens), device=tokens.device)
    reach = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    reach[rows, facts] = 1.0
    weights = []

    def hook(module, inputs, output):  # output: (batch, heads, queries, keys)
        nonlocal reach
        weights.append(output[rows, :, queries, facts])  # in the dtype computed: .float() zeroes float64's 1e-50
        visible = (output != 0).any(1).to(torch.float32)  # (batch, queries, keys): some head passes key to query
        reach = torch.maximum(reach, (visible @ reach.unsqueeze(-1)).squeeze(-1).clamp(max=1.0))

    with forward_hooks([block.attn.weights for block in decoder.blocks], lambda _: hook):
        decoder.hidden_states(tokens, attention="eager", softmax_dtype=softmax_dtype)
    return AnswerPaths(torch.stack(weights, 1).cpu(), reach[rows, queries].bool().cpu())
