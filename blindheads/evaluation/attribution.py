"""Which heads carry recall, and was the recall lost beyond the training window lost to the position bias?

"Blind" (every layer-head gives the fact exactly 0 weight) can never hold for ALiBi, whose shallowest heads still
see 8 windows back, and a weight of 1e-28 is no more use than 0. So the heads are judged by what they do:

- **ablation**: a head's attention output at the answer's query (the query that predicts the answer's first content
  token) is set to zero, everything it reads there from the fact and from every other key, and recall re-scored.
  The heads whose ablation costs at least ``CARRIES`` of the in-window recall *carry* it.
- **classes**: per episode, by the weights the carriers give the fact from the answer's query: ``blind`` (all
  exactly 0), ``near_blind`` (all below ``NEAR_BLIND``, not all 0) or ``reachable``.
- **cap**: every head's bias beyond a distance held at its value there (the training window's farthest key):
  recall that returns under the cap was lost to the bias; recall that does not, to something else. The cap changes
  two things at once: it removes exact zeros, and it removes bias values the model never met in training.
- **zero-free**: the same model computed in float64 (``in_float64``), where no weight underflows until its bias
  passes ~708 nats: the zeros removed, every weight otherwise as it was. A forward pass cannot tell a weight of 0
  from one of 1e-50, so recall that does not change here was not lost to the zeros.
- **floor**: every head's bias held at or above a floor (``floored_bias``): weights kept small but never exactly 0,
  and far from 0 wherever the floor acts inside the window.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import cast

import torch
from torch import Tensor

from blindheads.evaluation.answer_paths import AnswerPaths, answer_paths
from blindheads.evaluation.recall import Episode
from blindheads.evaluation.scoring import score_samples
from blindheads.numerics import LEARNING_HORIZON

CARRIES = 0.05  # share of the in-window episodes a head's ablation must cost for the head to carry recall
# A fact weight (absolute) below e^-H is past the learning horizon (its relative weight is below that too): as good as
# blind for what a head learns to read, though not zero. Such a head is no carrier of the fact, as a blind one is not.
NEAR_BLIND = math.exp(-LEARNING_HORIZON)


def length_batches(episodes: Sequence[Episode], batch_size: int) -> Iterator[list[int]]:
    """Indices of ``episodes`` in batches of at most ``batch_size`` of one length: one forward pass each."""
    by_length = defaultdict(list)
    for index, episode in enumerate(episodes):
        by_length[episode.sample.length].append(index)
    for indices in by_length.values():
        for start in range(0, len(indices), batch_size):
            yield indices[start : start + batch_size]


def episode_paths(decoder, episodes: Sequence[Episode], batch_size: int, dtype: torch.dtype) -> AnswerPaths:
    """The answer paths of every episode, in the episodes' order (batched by length): from the query that predicts
    the answer's first content token to the fact's, the softmax in ``dtype``."""
    device = next(decoder.parameters()).device
    weights: list[Tensor | None] = [None] * len(episodes)
    reachable: list[Tensor | None] = [None] * len(episodes)
    for batch in length_batches(episodes, batch_size):
        tokens = torch.stack([episodes[i].sample.tokens for i in batch]).to(device)
        queries = torch.tensor([episodes[i].answer - 1 for i in batch], device=device)
        facts = torch.tensor([episodes[i].fact for i in batch], device=device)
        paths = answer_paths(decoder, tokens, queries, facts, dtype)
        for row, i in enumerate(batch):
            weights[i], reachable[i] = paths.weights[row], paths.reachable[row]
    filled = cast(list[Tensor], weights), cast(list[Tensor], reachable)  # each episode in one batch
    return AnswerPaths(torch.stack(filled[0]), torch.stack(filled[1]))


@contextmanager
def ablated(decoder, layer: int, head: int, queries: Tensor) -> Iterator[None]:
    """For the block, head ``head`` of layer ``layer`` outputs zero at position ``queries[b]`` of each row ``b``: a
    pre-hook on the layer's output projection, whose input holds the heads' outputs side by side."""
    size = decoder.config.head_size

    def zero_head(module, inputs):
        x = inputs[0].clone()
        x[torch.arange(len(x)), queries.to(x.device), head * size : (head + 1) * size] = 0
        return (x,)

    handle = decoder.blocks[layer].attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        yield
    finally:
        handle.remove()


def recall(
    decoder, tokenizer, episodes: Sequence[Episode], batch_size: int, ablate: tuple[int, int] | None = None
) -> Tensor:
    """(episodes,) bool: each episode answered exactly (``score_samples``), with head ``ablate = (layer, head)``
    zeroed at the answer's query."""
    exact = torch.zeros(len(episodes), dtype=torch.bool)
    for batch in length_batches(episodes, batch_size):
        queries = torch.tensor([episodes[i].answer - 1 for i in batch])
        with nullcontext() if ablate is None else ablated(decoder, *ablate, queries):
            scores = score_samples(decoder, tokenizer, [episodes[i].sample for i in batch], len(batch))
        exact[batch] = torch.tensor([s.exact for s in scores])
    return exact


def ablation_costs(decoder, tokenizer, episodes: Sequence[Episode], batch_size: int) -> Tensor:
    """(layers, heads): the share of ``episodes`` answered exactly that ablating each layer-head loses."""
    intact = recall(decoder, tokenizer, episodes, batch_size).float().mean()
    heads = [(layer, head) for layer in range(decoder.config.num_layers) for head in range(decoder.config.num_heads)]
    lost = [intact - recall(decoder, tokenizer, episodes, batch_size, h).float().mean() for h in heads]
    return torch.stack(lost).view(decoder.config.num_layers, decoder.config.num_heads)


def carrier_classes(weights: Tensor, carriers: Tensor, floor: float = NEAR_BLIND) -> dict[str, Tensor]:
    """Per episode, ``blind`` / ``near_blind`` / ``reachable`` (bool, one true each) by the weights ``weights``
    (episodes, layers, heads) that the ``carriers`` (layers, heads: bool, at least one) give the fact."""
    if not carriers.any():
        raise ValueError("no head carries recall: nothing to class the episodes by")
    carried = weights[:, carriers]
    blind = (carried == 0).all(1)
    near_blind = (carried < floor).all(1) & ~blind
    return {"blind": blind, "near_blind": near_blind, "reachable": ~(blind | near_blind)}


def in_float64(decoder):
    """The decoder's float64 copy, in evaluation mode: every computation in float64, where no attention weight
    underflows until its bias passes ~708 nats (float64's smallest normal; ~745 with subnormals kept; float32: ~87),
    forward or backward. Score it outside autocast. Made outside inference mode (``test`` runs in it), whose tensors
    the backends' caches could not version."""
    with torch.inference_mode(False):
        wide = copy.deepcopy(decoder).double().eval()
    for block in wide.blocks:  # the eager softmax's own dtype is a setting, not a tensor: .double() leaves it
        block.attn.weights.dtype = torch.float64
    wide.config = dataclasses.replace(wide.config, dtype="float64", softmax_dtype="float64")
    return wide


@contextmanager
def floored_bias(decoder, floor: float) -> Iterator[None]:
    """For the block, every head's bias (after every stage of the stack) is at least ``floor``, in fresh backends
    as in ``capped_bias``."""
    with _bias_changed(decoder, lambda bias, d, h, q_idx: bias(d, h, q_idx).clamp_min(floor)):
        yield


@contextmanager
def capped_bias(decoder, distance: int) -> Iterator[None]:
    """For the block, every head's bias at keys farther back than ``distance`` is its bias at ``distance``: the
    distances fed to the stack's bias are clamped there, so every later stage (log distances, clamps) applies as
    usual. The decoder's own kind of backend runs meanwhile, in fresh instances: the cached ones hold the bias they
    built before, and keep it for after."""
    with _bias_changed(decoder, lambda bias, d, h, q_idx: bias(d.clamp_max(distance), h, q_idx)):
        yield


@contextmanager
def _bias_changed(decoder, changed) -> Iterator[None]:
    """For the block, the stack's bias of distance is ``changed(bias, d, h, q_idx)``, ``bias`` its own, in fresh
    backends (the cached ones keep the bias they built, for after)."""
    stack = decoder.position
    bias_of_distance = stack.bias_of_distance
    stack.bias_of_distance = lambda d, h, q_idx=None: changed(bias_of_distance, d, h, q_idx)
    cached, decoder._backends = decoder._backends, {}
    try:
        yield
    finally:
        del stack.bias_of_distance
        decoder._backends = cached
