"""Sandwich (Chi et al. 2023, as NVIDIA NeMo's ``SandwichRelativePositionEmbedding`` computes it) against the sum
of cosines written out by hand: a bias bounded at every distance, so never blind where its bound is below tau."""

import json
import math

import pytest
import torch
from support.backends import eager_and_sdpa_agree, flex_matches_sdpa
from support.softmax import reference_zero_mask

from blindheads.blindness import bias_only_logits, blind_keys, effective_tau
from blindheads.cli import main
from blindheads.modules.position import Sandwich, build_position
from blindheads.numerics import LEARNING_HORIZON, tau

HEADS, DIM = 8, 64  # the calculator's head count below; the component's default dimension


def by_hand(d: int, head: int, heads: int = HEADS, dim: int = DIM) -> float:
    """``(sum_{k=1}^{dim/2} cos(d / 10000^(2k/dim)) - dim/2) / (8 (head + 1) / heads)``: NeMo's formula, with
    Python's ``math.cos`` in float64."""
    total = sum(math.cos(d / 10000 ** (2 * k / dim)) for k in range(1, dim // 2 + 1))
    return (total - dim / 2) / (8 * (head + 1) / heads)


def component_bias(stack, distances: list[int], head: int) -> list[float]:
    d = torch.tensor(distances, dtype=torch.float64)
    return stack.bias_of_distance(d, torch.full_like(d, head, dtype=torch.long)).tolist()


def test_the_bias_is_the_sum_of_cosines_written_out_by_hand():
    stack = build_position("sandwich", num_heads=HEADS, context_length=4096)
    distances = [0, 1, 2, 3, 7, 19, 100, 229, 1000, 2987, 4095, 65536, 10**6]
    for head in (0, 1, 3, 7):
        assert component_bias(stack, distances, head) == pytest.approx(
            [by_hand(d, head) for d in distances], rel=1e-9, abs=1e-9
        )
    assert not stack.monotone and stack.has_bias and not stack.query_dependent


def test_bias_at_zero_distance_is_zero_as_nemo_subtracts_its_value_there():
    """NeMo subtracts ``dim/2``, the sum at ``d = 0`` (every cosine 1), so ``bias(0) = 0`` exactly for each head,
    and the bias never rises above it."""
    stack = build_position("sandwich", num_heads=HEADS, context_length=4096)
    dense = stack.dense_bias(1, 4096, "cpu")[:, 0]  # the last query's row, key positions 0 .. 4095
    assert (dense[:, -1] == 0).all() and (dense <= 0).all()
    odd = build_position("sandwich(dim=6, scales=[0.5, 3])", num_heads=2, context_length=64)
    assert component_bias(odd, [0], 0) == [0.0] and component_bias(odd, [0], 1) == [0.0]


def test_bounded_by_dim_times_its_scale_at_every_distance_up_to_a_million():
    """Each cosine lies in [-1, 1], so ``-dim * s_h <= bias <= 0``; with 8 heads ``s_h = 1 / (h + 1)``, head 0's
    bound is 64, below float32's and bfloat16's tau (87.3) at any distance."""
    stack = build_position("sandwich", num_heads=HEADS, context_length=4096)
    (sandwich,) = stack
    assert isinstance(sandwich, Sandwich)
    bound = sandwich.bound().double()
    torch.testing.assert_close(bound, torch.tensor([DIM / (h + 1) for h in range(HEADS)], dtype=torch.float64))
    d = torch.arange(10**6 + 1, dtype=torch.float64)
    for head in (0, HEADS - 1):  # every distance; the heads between differ by their scale alone (below)
        bias = stack.bias_of_distance(d, torch.tensor(head))
        assert bias.max() <= 0 and bias.min() >= -bound[head], head
    some = d[::997]
    rows = stack.bias_of_distance(some.expand(HEADS, -1), torch.arange(HEADS)[:, None])
    torch.testing.assert_close(rows, rows[:1] * sandwich.scales.double()[:, None] / sandwich.scales[0].item())
    assert (rows >= -bound[:, None]).all()
    assert bound.max() < min(tau("float32"), tau("bfloat16"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("threshold", ["normal", "subnormal"])
@pytest.mark.parametrize("softmax", ["fused", "materialized"])
def test_the_calculator_says_never_blind_and_finds_the_horizon_by_hand(dtype, threshold, softmax, capsys):
    """Every head's bound (at most 64) is below tau - ln(4096) (79 in bfloat16): no weight is ever exactly zero,
    ``blind_distance`` is null. The horizon is the first distance whose bias passes ``H = 12`` nats below the row's
    largest weight (the bias at d = 0): heads 5..7, bounded by 64 / 6 < 12, never pass it (null), and heads 0..4
    have the first such distance of the sum of cosines by hand, null where none lies in the context."""
    main(["blindness", "--heads", "8", "--context", "4096", "--bias", "sandwich", "--dtype", dtype,
          "--threshold", threshold, "--softmax", softmax, "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["monotone"] is False and report["underflow_last_query"] == report["underflow_all_pairs"] == 0
    assert [h["blind_distance"] for h in report["heads"]] == [None] * HEADS
    expected = []
    for head in range(HEADS):
        below = [d for d in range(4096) if by_hand(d, head) < -LEARNING_HORIZON]
        expected.append(float(below[0]) if below else None)
    assert [h["horizon_distance"] for h in report["heads"]] == expected
    assert expected[:3] == [19.0, 229.0, 2987.0] and expected[3:] == [None] * 5  # 64 / (h + 1) < 12 from head 5


def test_float16_blinds_the_first_heads_where_a_real_softmax_does():
    """float16's tau (17.3 with subnormals) is below heads 0..3's bounds (64, 32, 21.3, 16): the bound is what keeps a
    head sighted. The calculator's scan equals the zeros of a real softmax of the model's bias, key by key."""
    stack = build_position("sandwich", num_heads=HEADS, context_length=4096, dtype="float16", threshold="subnormal")
    reference = reference_zero_mask(stack, 4096, "float16", "subnormal", "fused").flip(-1)  # by distance
    edge_tau = effective_tau(stack, 4096, "float16", "subnormal")
    predicted = blind_keys(stack, edge_tau, 4096)
    d = torch.arange(4096, dtype=torch.float64)
    on_the_edge = (bias_only_logits(stack, d) + edge_tau[:, None]).abs() <= 0.25  # float16's rounding decides there
    assert reference[:2].any(-1).all() and not reference[3:].any()
    assert not ((predicted != reference) & ~on_the_edge).any()


def test_refuses_options_out_of_range():
    for spec, message in [
        ("sandwich(dim=63)", "sandwich dim must be an even integer from 2 to 8192, got 63"),
        ("sandwich(dim=0)", "sandwich dim must be an even integer"),
        ("sandwich(dim=64.0)", "sandwich dim must be an even integer"),
        ("sandwich(dim=inf)", "sandwich dim must be finite"),
        ("sandwich(base=1)", "sandwich base must be a number > 1, got 1"),
        ("sandwich(base=nan)", "sandwich base must be finite"),
        ("sandwich(scales=0.5)", "sandwich scales takes a list of 4 positive values, got 0.5"),
        ("sandwich(scales=[1, 2])", "sandwich scales takes 4 positive values (one per head), got [1, 2]"),
        ("sandwich(scales=[1, 1, 1, -1])", "sandwich scales takes 4 positive values"),
        ("sandwich(scales=[1, 1, 1, 1e39])", "sandwich scales must be finite in float32"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            build_position(spec, num_heads=4, context_length=64)


def test_a_sandwich_decoder_gives_equal_logits_under_eager_and_sdpa():
    grads = eager_and_sdpa_agree("sandwich")
    assert not [name for name in grads if name.startswith("position.")]  # nothing to learn: fixed, as in NeMo


@pytest.mark.slow  # compiles FlexAttention
def test_compiled_flex_matches_sdpa():
    flex_matches_sdpa("sandwich")
