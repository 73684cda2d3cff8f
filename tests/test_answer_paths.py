"""Blind and unreachable facts against a hand-built case: heads whose bias alone puts a known zero edge."""

import pytest
import torch
from support.models import tiny_lm

from blindheads.evaluation.answer_paths import answer_paths
from blindheads.numerics import tau

BLIND = 48  # every head's bias reaches -tau at 48 tokens: weights beyond it are exactly zero, well inside it not


@pytest.fixture
def decoder():
    torch.manual_seed(0)
    position = f"alibi(blind_distances=[{BLIND}, {BLIND}, {BLIND}, {BLIND}])"
    model = tiny_lm(dtype="float32", context_length=256, position=position, num_layers=2).decoder.eval()
    torch.set_flush_denormal(True)  # the float32 `normal` threshold, as blindheads fit sets it
    yield model
    torch.set_flush_denormal(False)


@pytest.mark.parametrize(
    "distance, blind, reachable",
    [
        (20, False, True),  # bias -36 nats: every head gives the fact weight
        (70, True, True),  # bias -127: zero in every head, but two hops of 35 tokens carry it (2 layers)
        (150, True, False),  # beyond two hops of at most 48 + a few tokens: no path at all
    ],
)
def test_blind_and_reachable_follow_the_bias(decoder, distance, blind, reachable):
    assert next(iter(decoder.position)).slopes.tolist() == pytest.approx([tau(torch.float32, "normal") / BLIND] * 4)
    tokens = torch.randint(0, 4096, (3, 200))
    queries = torch.tensor([199, 180, 160])
    facts = queries - distance
    paths = answer_paths(decoder, tokens, queries, facts)
    assert paths.weights.shape == (3, 2, 4)
    assert paths.blind.tolist() == [blind] * 3
    assert paths.reachable.tolist() == [reachable] * 3
    # the reference: the eager softmax of the same model, read at the same places
    weights = []
    hooks = [b.attn.weights.register_forward_hook(lambda m, i, o: weights.append(o)) for b in decoder.blocks]
    with torch.no_grad():
        decoder.hidden_states(tokens, attention="eager")
    for h in hooks:
        h.remove()
    for layer, w in enumerate(weights):
        assert torch.equal(paths.weights[:, layer], w[torch.arange(3), :, queries, facts])
