"""The calculator against real softmaxes of the project's own bias, at the arguments a user gets by default.

References, computed independently of the calculator from ``PositionStack.dense_bias`` (what the model adds):
- materialised: ``torch.softmax`` of the bias in the dtype (eager and SDPA hand out these weights);
- fused: ``exp(bias - max)`` in float32 (float64 for float64) cast to the dtype, as flash and FlexAttention
  kernels compute it before normalising.
``normal`` runs with subnormals flushed, ``subnormal`` with them kept.
"""

import math

import pytest
import torch
from support.softmax import CASES, reference_zero_mask

from blindheads.blindness import blindness_report, log_normaliser
from blindheads.modules.position import build_position
from blindheads.modules.position.clamp import DEFAULT_MARGIN, keeping_floor
from blindheads.numerics import tau

PAPER_SPECS = [
    "alibi",
    "alibi(steep)",
    "alibi(safe)",
    "alibi(wide)",
    "alibi(robust)",
    "alibi(mpt)",
    "alibi(learnable=True)",
    "alibi+clamp",
    "alibi+log_distance",
    "alibi+soft_cap",
    "alibi+soft_cap(where=before)",
    "alibi+sliding_window(1024)",
    "alibi+clamp+log_distance",
    "alibi(wide)+clamp",
    "alibi(wide)+clamp+log_distance",
    "alibi(robust)+clamp",
    "rope",
    "nope",
]


def reference_zeros(stack, context, dtype, threshold, softmax, scores=None):
    """Per head, how many of the last query's ``context`` weights a real softmax makes exactly zero."""
    return reference_zero_mask(stack, context, dtype, threshold, softmax, scores).sum(-1)


def predicted_zeros(stack, context, dtype, threshold, softmax):
    report = blindness_report(stack, context, dtype, threshold, softmax)
    return torch.tensor([round(h.underflow_last_query * context) for h in report.heads])


@pytest.mark.parametrize("softmax", ["fused", "materialized"])
@pytest.mark.parametrize("dtype, threshold", CASES)
def test_every_paper_setup_at_default_arguments(dtype, threshold, softmax):
    """Same verdict (blind or sighted within the context) per head, and the number of zero weights within one key."""
    for spec in PAPER_SPECS:
        stack = build_position(spec, 9, 2048, dtype, threshold)
        reference = reference_zeros(stack, 2048, dtype, threshold, softmax)
        predicted = predicted_zeros(stack, 2048, dtype, threshold, softmax)
        assert torch.equal(predicted > 0, reference > 0), (spec, predicted.tolist(), reference.tolist())
        assert (predicted - reference).abs().max() <= 1, (spec, predicted.tolist(), reference.tolist())


@pytest.mark.parametrize("threshold", ["normal", "subnormal"])
@pytest.mark.parametrize("heads, context", [(9, 2048), (16, 2048), (9, 4096), (16, 4096)])
def test_materialized_counts_the_zero_weights_of_torch_softmax(heads, context, threshold):
    stack = build_position("alibi", heads, context, "float32", threshold)
    reference = reference_zeros(stack, context, "float32", threshold, "materialized")
    predicted = predicted_zeros(stack, context, "float32", threshold, "materialized")
    assert reference.sum() > 0
    assert (predicted - reference).abs().max() <= 1, (predicted.tolist(), reference.tolist())
    # the fused definition misses the normaliser: it predicts fewer zeros, ln Z / m keys fewer per head
    fused = predicted_zeros(stack, context, "float32", threshold, "fused")
    assert (fused <= predicted).all() and (fused < predicted).any()


def test_the_normaliser_is_the_log_sum_exp_of_the_row():
    stack = build_position("alibi", 9, 2048, "float32", "normal")
    slopes = stack.components[0].slopes.double()
    d = torch.arange(2048, dtype=torch.float64)
    by_hand = torch.log(torch.exp(-slopes[:, None] * d).sum(-1))  # a geometric series, summed directly
    torch.testing.assert_close(log_normaliser(stack, 2048), by_hand, rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype, threshold", CASES)
def test_the_default_clamp_keeps_every_weight(dtype, threshold):
    stack = build_position("alibi+clamp", 9, 2048, dtype, threshold)
    for softmax in ("fused", "materialized"):
        assert reference_zeros(stack, 2048, dtype, threshold, softmax).sum() == 0
    # q.k anywhere in [-margin, 0] (0 at the query's own key) still leaves every weight non-zero ...
    scores = -DEFAULT_MARGIN * torch.rand(9, 2048, generator=torch.Generator().manual_seed(0))
    scores[:, -1] = 0
    assert reference_zeros(stack, 2048, dtype, threshold, "materialized", scores).sum() == 0
    # ... and a key at the floor pushed a little more than ln(L) further down is dropped: the floor is at the edge
    scores[:, 0] = -(DEFAULT_MARGIN + math.log(2048) + 1)
    at_floor = stack.dense_bias(1, 2048, "cpu")[:, 0, 0] == stack.components[1].floor
    assert at_floor.any()
    assert torch.equal(reference_zeros(stack, 2048, dtype, threshold, "materialized", scores) > 0, at_floor)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_a_floor_at_minus_tau_keeps_nothing_and_the_calculator_says_so(dtype):
    """The old default: a weight at the floor is exp(-tau)/Z with Z > 1, and -tau itself rounds further down.
    (With subnormals kept, a floor right at the edge is decided by double rounding, head by head.)"""
    threshold = "normal"
    stack = build_position(f"alibi+clamp({-tau(dtype, threshold)})", 9, 2048, dtype, threshold)
    reference = reference_zeros(stack, 2048, dtype, threshold, "materialized")
    predicted = predicted_zeros(stack, 2048, dtype, threshold, "materialized")
    assert reference.sum() > 0
    assert torch.equal(predicted > 0, reference > 0)


def test_the_floor_is_derived_by_hand():
    # bfloat16 at 2048 tokens: -(87.3365 - ln 2048 - 8) = -71.71, rounded toward zero to bfloat16's 0.5 spacing
    assert keeping_floor("bfloat16", "normal", 2048) == -71.5
    float32 = keeping_floor("float32", "normal", 2048)
    exact = -(126 * math.log(2) - 11 * math.log(2) - 8)  # ln tiny = -126 ln 2, ln 2048 = 11 ln 2
    assert exact < float32 < exact + 1e-5 and float32 == torch.tensor(float32).item()
    # float16 keeping subnormals, 512 tokens, no margin: -(25 ln 2 - 9 ln 2) = -11.0904, toward zero at spacing 2^-7
    assert keeping_floor("float16", "subnormal", 512, margin=0) == -11.0859375


@pytest.mark.parametrize(
    "spec, message",
    [
        ("alibi+clamp", "no clamp floor keeps every weight in float16 (normal threshold, tau 9.70) at context 2048"),
        ("alibi+clamp(margin=-1)", "clamp margin must be >= 0, got -1"),
        ("alibi+clamp(-60, margin=2)", "clamp takes a floor (-60) or a margin (2), not both"),
    ],
)
def test_impossible_clamps_are_refused(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_position(spec, 9, 2048, "float16", "normal")
