"""The learning horizon beside the blind distance: where a head's bias passes ``H`` nats, from the calculator, in
the weights the underflow monitor reduces, and in the probe's outputs; each against a direct computation."""

import json
import math

import pytest
import torch

from blindheads.blindness import horizon_distances
from blindheads.cli import main
from blindheads.evaluation.underflow import zero_statistics
from blindheads.modules.position import build_position
from blindheads.numerics import LEARNING_HORIZON, tau


def test_the_papers_148m_setup_gives_every_head_its_horizon_h_over_m_beside_tau_over_m(capsys):
    main(["blindness", "--heads", "16", "--context", "2048", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["horizon"] == LEARNING_HORIZON == 12.0
    slopes = [2 ** (-0.5 * (k + 1)) for k in range(16)]  # Press: r^1..r^16 with r = 2^(-8/16)
    for head, slope in zip(report["heads"], slopes):
        assert head["slope"] == pytest.approx(slope)
        assert head["horizon_distance"] == pytest.approx(12.0 / slope, rel=1e-6)
        assert head["blind_distance"] == pytest.approx(tau("bfloat16") / slope, rel=1e-6)
    steepest = report["heads"][0]
    assert (round(steepest["horizon_distance"], 1), round(steepest["blind_distance"], 1)) == (17.0, 123.5)


@pytest.mark.parametrize("spec", ["alibi+log_distance", "kerple_log", "alibi(steep)+clamp(-20)"])
def test_a_horizon_distance_is_where_the_stacks_own_bias_falls_past_h(spec):
    """Against the bias the model adds (its dense bias, last row): sighted before the distance, past H after it; a
    clamp above -H is never past it."""
    torch.manual_seed(0)
    stack = build_position(spec, 4, 512, "float32", "normal")
    distances = horizon_distances(stack, 512, 6.0)
    bias = stack.dense_bias(512, 512, torch.device("cpu")).double()[:, -1].flip(-1)  # (heads, distance 0..511)
    for head, distance in enumerate(distances.tolist()):
        if math.isinf(distance):
            assert (bias[head] >= -6.0).all()
            continue
        d = math.ceil(distance)
        assert (bias[head, :d] >= -6.0 - 1e-6).all() and (bias[head, d + 1 :] < -6.0 + 1e-6).all()
    if "clamp(-20)" in spec:
        assert torch.isfinite(distances).all()  # the clamp at -20 lies past H = 6: every head passes it


@pytest.mark.parametrize(("value", "message"), [("0", "--horizon must be"), ("nan", "--horizon must be"),
                                                ("-1", "--horizon must be"), ("inf", "--horizon must be")])  # fmt: skip
def test_a_horizon_that_is_not_a_positive_number_of_nats_is_one_line(value, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["blindness", "--heads", "4", "--horizon", value])
    assert exit.value.code not in (0, None) and message in capsys.readouterr().err


def test_the_share_past_the_horizon_counts_weights_below_e_minus_h_of_their_rows_largest():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 40, 40) * 4 - 2.0 * torch.arange(40.0).flip(0)  # steep towards the first keys
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    weights = torch.softmax(logits.masked_fill(~causal, -math.inf), dim=-1)
    stats = zero_statistics(weights, horizon=5.0)
    relative = weights.double() / weights.double().amax(-1, keepdim=True)
    expected = ((relative < math.exp(-5.0)) & causal).sum(dim=(0, 2, 3)).double() / (2 * 40 * 41 / 2)
    torch.testing.assert_close(stats.deaf_share, expected)
    assert (stats.deaf_share >= stats.zero_share).all() and (stats.deaf_share > stats.zero_share).any()
