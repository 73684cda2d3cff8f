"""The blindness calculator: thresholds, distances, shares, and theory against measured softmaxes."""

import math

import pytest
import torch

from blindheads.blindness import blind_distances, blindness_report, underflow_all_pairs, underflow_last_query
from blindheads.modules.backends import AttentionWeights, eager_attention
from blindheads.modules.position import build_position
from blindheads.numerics import DTYPES, apply_threshold, flushing_subnormals, measure_tau, tau


def test_tau_values():
    assert tau("float32") == pytest.approx(126 * math.log(2))
    assert tau("bfloat16") == tau("float32")  # same exponent range
    assert tau("float16") == pytest.approx(14 * math.log(2))
    assert tau("float64") == pytest.approx(1022 * math.log(2))
    assert tau("float32", "subnormal") == pytest.approx(150 * math.log(2))
    assert tau("bfloat16", "subnormal") == pytest.approx(134 * math.log(2))
    assert tau("float16", "subnormal") == pytest.approx(25 * math.log(2))
    assert tau("float64", "subnormal") == pytest.approx(1075 * math.log(2))
    assert tau(torch.float32) == tau("torch.float32")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_cpu_softmax_keeps_subnormals(dtype):
    assert measure_tau(dtype) == pytest.approx(tau(dtype, "subnormal"), abs=1e-2)


def test_bfloat16_measurement_is_resolved_to_its_precision():
    # the gap itself is rounded to bfloat16 (8 bits of mantissa): 92.75 is the nearest representable gap
    assert abs(measure_tau("bfloat16") - tau("bfloat16", "subnormal")) < 0.5


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_flushing_subnormals_gives_the_normal_threshold(dtype):
    with flushing_subnormals():
        measured = measure_tau(dtype)
    assert measured == pytest.approx(tau(dtype, "normal"), abs=1e-6)
    assert measure_tau(dtype) > tau(dtype, "normal") + 10  # restored afterwards


@pytest.mark.parametrize(
    "dtype, backend, regime",
    [
        ("float32", "eager", "subnormal"),
        ("float32", "sdpa", "subnormal"),
        ("bfloat16", "eager", "subnormal"),  # its softmax runs in float32, which keeps them
        ("bfloat16", "sdpa", None),  # CPU SDPA's bfloat16 kernel flushes them on some CPUs and keeps them on others
    ],
)
def test_measure_tau_tells_which_regime_each_cpu_kernel_is_in(dtype, backend, regime):
    """The two regimes' zero edges lie 5-17 nats apart; the bfloat16 gap is resolved to 0.5 (its spacing there).
    Where the regime depends on the CPU's kernel (``None``), the measurement must land on one of the two edges."""
    apply_threshold("subnormal")  # the process default, which an in-process CLI earlier in this worker changes
    measured = measure_tau(dtype, backend=backend)
    tolerance = 0.5 if dtype == "bfloat16" else 1e-4
    regimes = [regime] if regime else ["normal", "subnormal"]
    assert any(measured == pytest.approx(tau(dtype, r), abs=tolerance) for r in regimes), (measured, regimes)


@pytest.mark.parametrize("bad, message", [({"dtype": "int8"}, "valid: float64"), ({"backend": "cuda"}, "valid: eager")])
def test_measure_tau_rejects_bad_input(bad, message):
    with pytest.raises(ValueError, match=message):
        measure_tau(**{"dtype": "float32", **bad})


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("alibi([0.5, 0.25])", lambda t: [t / 0.5, t / 0.25]),
        ("alibi([0.5, 0.25])+log_distance", lambda t: [math.expm1(t / 0.5), math.expm1(t / 0.25)]),
        (
            "alibi([0.5, 0.25])+soft_cap(100)",
            lambda t: [100 * math.atanh(t / 100) / 0.5, 100 * math.atanh(t / 100) / 0.25],
        ),
        ("alibi([0.5, 0.25])+soft_cap(50)", lambda t: [math.inf, math.inf]),
        ("alibi([0.5, 0.25])+soft_cap(50, where=before)", lambda t: [t / 0.5, t / 0.25]),
        ("alibi([0.5, 0.25])+clamp", lambda t: [math.inf, math.inf]),
        ("alibi([0.5, 0.25])+clamp(-80)", lambda t: [math.inf, math.inf]),
        ("alibi([0.5, 0.25])+clamp(-100)", lambda t: [t / 0.5, t / 0.25]),
        ("alibi([0.5, 0.25])+sliding_window(64)", lambda t: [64, 64]),
        ("rope", lambda t: [math.inf, math.inf]),
        ("nope", lambda t: [math.inf, math.inf]),
    ],
)
def test_closed_form_and_search_agree_with_the_formula(spec, expected):
    stack = build_position(spec, num_heads=2, context_length=128)
    t = tau("float32")
    want = torch.tensor(expected(t), dtype=torch.float64)
    torch.testing.assert_close(blind_distances(stack, t), want, rtol=1e-9, atol=0)
    torch.testing.assert_close(blind_distances(stack, t, search=True), want, rtol=1e-9, atol=0)


def test_underflow_shares_count_keys_and_pairs():
    distances = torch.tensor([2.5, 0.0, math.inf, 10.0])
    # last query of L=4 sees distances 0..3: blind from 3 -> 1 of 4; from 0 -> all; never -> none; beyond L -> none
    torch.testing.assert_close(underflow_last_query(distances, 4), torch.tensor([0.25, 1.0, 0.0, 0.0]))
    # all 10 causal pairs of L=4: pairs at distance 3: 1 -> 1/10; every pair from distance 0
    torch.testing.assert_close(underflow_all_pairs(distances, 4), torch.tensor([0.1, 1.0, 0.0, 0.0]))


def test_underflow_shares_match_a_brute_force_count():
    stack = build_position("alibi", num_heads=8, context_length=512)
    context = 500
    distances = blind_distances(stack, tau("bfloat16"))
    d = torch.arange(context, dtype=torch.float64)
    blind = d[None, :] >= distances[:, None]  # (heads, distance)
    pairs_at_distance = context - d
    torch.testing.assert_close(underflow_last_query(distances, context), blind.double().mean(-1))
    torch.testing.assert_close(
        underflow_all_pairs(distances, context),
        (blind * pairs_at_distance).sum(-1) / (context * (context + 1) / 2),
    )


def measured_first_zero(spec, heads, context, dtype):
    """Run a bias-only attention (q = k = 0) with the eager backend and find, per head, the distance from which
    the last query's weights are exactly zero (``inf`` if none is)."""
    stack = build_position(spec, heads, context)
    weights, seen = AttentionWeights(dtype), {}
    weights.register_forward_hook(lambda module, inputs, output: seen.update(probs=output))
    zeros = torch.zeros(1, heads, context, 8, dtype=dtype)
    eager_attention(zeros, zeros, zeros, stack, weights)
    by_distance = seen["probs"][0, :, -1].flip(-1)
    distance = torch.arange(context)
    last_nonzero = torch.where(by_distance != 0, distance, -1).max(-1).values
    first_zero = (last_nonzero + 1).double()
    return stack, torch.where(first_zero >= context, math.inf, first_zero)


def predicted_first_zero(stack, context, measured_tau):
    """The calculator's prediction: the weight is ``exp(bias - ln Z)``, so head h goes blind where its bias reaches
    ``-(tau - ln Z_h)``."""
    log_z = torch.logsumexp(stack.dense_bias(1, context, "cpu")[:, 0].double(), dim=-1)
    first = torch.ceil(blind_distances(stack, measured_tau - log_z))
    return torch.where(first >= context, math.inf, first)


THEORY_SPECS = [
    "alibi",
    "alibi(steep)",
    "alibi(wide)",
    "alibi([3.0, 1.7, 0.9, 0.33, 0.21, 0.11, 0.07, 0.05])+soft_cap(200)",
    "alibi+log_distance",
    "alibi+clamp(-60)",
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spec", THEORY_SPECS)
def test_theory_equals_measurement_when_subnormals_flush(spec, dtype):
    with flushing_subnormals():
        stack, measured = measured_first_zero(spec, 8, 1024, dtype)
        predicted = predicted_first_zero(stack, 1024, measure_tau(dtype))
    assert measure_tau(dtype) != tau(dtype, "normal")
    torch.testing.assert_close(measured, predicted, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("spec", THEORY_SPECS)
def test_theory_within_one_token_when_subnormals_are_kept(spec, dtype):
    """Kept subnormals have few significant bits: ``exp`` and the division by Z each round, which moves the first
    zero by at most one token."""
    stack, measured = measured_first_zero(spec, 8, 1024, dtype)
    predicted = predicted_first_zero(stack, 1024, measure_tau(dtype))
    assert torch.equal(measured.isinf(), predicted.isinf())
    finite = measured.isfinite()
    assert ((measured[finite] - predicted[finite]).abs() <= 1).all()


def test_report_averages_heads_and_matches_the_table_fields():
    stack = build_position("alibi", num_heads=9, context_length=2048)
    report = blindness_report(stack, 2048, "bfloat16", "normal")
    assert report.tau == tau("bfloat16")
    assert len(report.heads) == 9 and report.heads[0].slope == 0.5
    assert report.heads[0].blind_distance == pytest.approx(tau("bfloat16") / 0.5)
    assert report.underflow_last_query == pytest.approx(sum(h.underflow_last_query for h in report.heads) / 9)
    assert 0 < report.underflow_all_pairs < report.underflow_last_query < 1
    assert set(report.to_dict()) >= {"tau", "heads", "underflow_last_query", "underflow_all_pairs"}
    assert set(DTYPES) == {"float64", "float32", "bfloat16", "float16"}
