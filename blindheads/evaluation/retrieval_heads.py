"""Which heads retrieve a passkey or a needle, and is what they retrieve beyond the training length lost to blindness?

The recall grid's attribution (``attribution.py``), applied to the retrieval tasks' prompts read as episodes
(``recall.retrieval_episode``: the fact is the answer's nearer copy in the context):

- **carriers**: the heads whose ablation at the answer's query costs at least ``CARRIES`` of the in-domain prompts
  (at most the training length) answered exactly;
- per head, where it goes blind: the calculator's prediction for the model's position stack, dtype and threshold
  (``blindness.predicted_blind_distances``, the ``materialized`` softmax the eager and SDPA paths use), and what the
  prompts show: the farthest fact it still gives a weight above 0 (``sighted_to``), the nearest it gives exactly 0
  (``blind_from``);
- per prompt: answered exactly, the carriers' weights on the fact (all exactly 0: ``carriers_blind``), the weight
  of the costliest carrier (``top_carrier``; exactly 0: ``top_blind``), and beyond the training length whether it is
  answered with every head's bias capped at the training window's farthest key (``capped_bias``: what returns under
  the cap was lost to the bias). Shallow heads keep every key in sight, so all carriers are rarely blind at once,
  and several heads share the retrieval: ``blind_cost_share`` is the share of the carriers' summed ablation cost
  that lies on carriers exactly blind to the key, ``near_blind_cost_share`` on carriers below ``NEAR_BLIND``.

Limits: a head is ablated only at the query that predicts the answer's first digit, and its weight read on the
key's first digit; carriers are found on the in-domain prompts and kept beyond them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from blindheads.blindness import predicted_blind_distances
from blindheads.evaluation.attribution import CARRIES, NEAR_BLIND, ablation_costs, capped_bias, episode_paths, recall
from blindheads.evaluation.prompts import RetrievalSample
from blindheads.evaluation.recall import retrieval_episode
from blindheads.numerics import resolve_dtype


@torch.no_grad()
def retrieval_heads(
    decoder, tokenizer, samples: Sequence[RetrievalSample], training_length: int, batch_size: int
) -> tuple[list[dict], list[dict]]:
    """One row per layer-head and one per prompt (see the module docstring), the softmax in the model's dtype (the
    one the trainer's precision computes attention in: ``numerics.check_trainer_precision``)."""
    episodes = [retrieval_episode(tokenizer, s) for s in samples]
    inside = [e for e in episodes if e.sample.length <= training_length]
    if not inside:
        raise ValueError(f"no prompt of at most the training length ({training_length} tokens): nothing to ablate")
    costs = ablation_costs(decoder, tokenizer, inside, batch_size)
    carriers = costs >= CARRIES
    config = decoder.config
    dtype = resolve_dtype(config.dtype)
    weights = episode_paths(decoder, episodes, batch_size, dtype).weights  # (prompts, layers, heads)
    exact = recall(decoder, tokenizer, episodes, batch_size)
    beyond = [i for i, e in enumerate(episodes) if e.sample.length > training_length]
    capped = {}
    if beyond and decoder.position.has_bias:
        with capped_bias(decoder, training_length - 1):
            answered = recall(decoder, tokenizer, [episodes[i] for i in beyond], batch_size)
        capped = {i: float(a) for i, a in zip(beyond, answered.tolist())}
    distances = torch.tensor([float(e.distance) for e in episodes])
    predicted = predicted_blind_distances(
        decoder.position, max(e.sample.length for e in episodes), config.dtype, config.threshold, "materialized"
    )
    heads = []
    for layer in range(config.num_layers):
        for head in range(config.num_heads):
            seen, zero = weights[:, layer, head] > 0, weights[:, layer, head] == 0
            heads.append({
                "layer": layer, "head": head, "ablation_cost": costs[layer, head].item(),
                "carries": bool(carriers[layer, head]), "blind_distance_predicted": predicted[head].item(),
                "sighted_to": distances[seen].max().item() if seen.any() else math.nan,
                "blind_from": distances[zero].min().item() if zero.any() else math.nan,
            })  # fmt: skip
    top = divmod(int(costs.argmax()), config.num_heads) if carriers.any() else None  # the costliest carrier
    prompts = []
    for i, episode in enumerate(episodes):
        carried = weights[i][carriers]
        sample = episode.sample
        prompts.append({
            "length": sample.length, "depth": sample.depth, "index": sample.index, "answer": sample.answer,
            "distance": episode.distance,
            "in_domain": sample.length <= training_length, "exact": bool(exact[i]),
            "exact_capped": capped.get(i, math.nan), "carriers": int(carriers.sum()),
            "carriers_blind": bool(carried.numel() and (carried == 0).all()),
            "carriers_max_weight": carried.max().item() if carried.numel() else math.nan,
            "top_carrier": "" if top is None else f"l{top[0]}h{top[1]}",
            "top_weight": math.nan if top is None else weights[i, top[0], top[1]].item(),
            "top_blind": top is not None and bool(weights[i, top[0], top[1]] == 0),
            "blind_cost_share": (costs[carriers & (weights[i] == 0)].sum() / costs[carriers].sum()).item()
            if carriers.any() else math.nan,
            "near_blind_cost_share": (costs[carriers & (weights[i] < NEAR_BLIND)].sum() / costs[carriers].sum()).item()
            if carriers.any() else math.nan,
        })  # fmt: skip
    return heads, prompts
