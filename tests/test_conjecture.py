"""blindheads conjecture: the bare head measured against a plain softmax, its batching against models trained
alone, exact zeros where the flush edge puts them, the decoder arm, the verdict's arithmetic, and the command done
in parts."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest
import torch

from blindheads.blindness import blind_distances
from blindheads.cli import main
from blindheads.experiments.conjecture import far_decoder, far_head
from blindheads.experiments.conjecture.report import classify, dose_table, verdict
from blindheads.modules.position import build_position
from blindheads.numerics import tau


def test_a_model_trained_in_the_batch_trains_exactly_as_it_would_alone():
    together = far_head.train(far_head.ARMS["adam"], ["0", "8"], [0, 1], 30, 10)["rows"]
    alone = far_head.train(far_head.ARMS["adam"], ["8"], [1], 30, 10)["rows"]
    (batched,) = [row for row in together if (row["condition"], row["seed"]) == ("8", 1)]
    assert batched["curve"]["accuracy"] == alone[0]["curve"]["accuracy"]
    assert batched["far_weight_end"] == pytest.approx(alone[0]["far_weight_end"], rel=1e-5)
    assert batched["key_gradient"] == pytest.approx(alone[0]["key_gradient"], rel=1e-5)


def test_the_heads_weights_are_a_plain_softmax_over_every_key():
    """The gathered per-vocabulary scores against embeddings, keys and a softmax computed position by position."""
    heads = far_head.Heads([3], 2, torch.float32)
    tokens, _, back = far_head.episodes(4, torch.Generator().manual_seed(0))
    tokens = tokens.expand(2, -1, -1)
    bias = far_head.step_bias(torch.tensor([0.0, 8.0], dtype=torch.float64), torch.float32)
    weights = heads.forward(tokens, bias)["weights"]
    p = {name: value.detach() for name, value in heads.params.items()}
    for model in range(2):
        embedded = heads.table().detach()[model][tokens[model]]  # (batch, LENGTH + 1, WIDTH)
        keys = embedded[:, :-1] @ p["key"][model]
        query = embedded[:, -1] @ p["query"][model]
        distance = far_head.LENGTH - torch.arange(far_head.LENGTH)
        step = torch.where(distance > far_head.NEAR, -[0.0, 8.0][model], 0.0)
        expected = torch.softmax((keys @ query[:, :, None]).squeeze(-1) / math.sqrt(far_head.WIDTH) + step, dim=-1)
        torch.testing.assert_close(weights[model], expected)
    ratio = (weights[1] / weights[0]).detach()  # the step's dose: a far key loses exp(-8) against a near one
    far = ratio.gather(1, (far_head.LENGTH - back)[:, None]).squeeze(1)
    torch.testing.assert_close(far / ratio[:, -1], torch.full((4,), math.exp(-8)))


def test_at_the_flush_edge_the_far_weight_and_its_gradient_are_exactly_zero_and_just_above_it_are_not():
    rows = far_head.train(far_head.ARMS["adam"], ["60", "tau", "masked"], [0], 2, 1)["rows"]
    by = {row["condition"]: row for row in rows}
    assert by["tau"]["bias"] == pytest.approx(tau("float32", "normal"))
    for zero in ("tau", "masked"):
        assert by[zero]["far_weight_start"] == 0 and by[zero]["far_weight_zero_start"] == 1
        assert by[zero]["key_gradient"] == by[zero]["value_gradient"] == 0 and by[zero]["gradient_zero"] == 1
    assert 0 < by["60"]["far_weight_start"] < 1e-25 and by["60"]["key_gradient"] > 0
    float64 = far_head.train(far_head.ARMS["float64"], ["tau"], [0], 1, 1)["rows"][0]
    assert 0 < float64["far_weight_start"] < 1e-38, "float64 keeps what float32 flushes"


def test_a_step_bias_is_flat_near_then_drops_and_the_calculator_finds_its_edge():
    stack = build_position("step(32, 100)", 2, 160, "float32", "normal")
    bias = stack.bias_of_distance(torch.tensor([0.0, 32.0, 33.0, 150.0]), torch.tensor(0))
    assert bias.tolist() == [0.0, 0.0, -100.0, -100.0]
    assert blind_distances(stack, tau("float32")).tolist() == pytest.approx([32.0, 32.0])  # keys past 32 back
    assert torch.isinf(blind_distances(build_position("step(32, 10)", 2, 160), tau("float32"))).all()
    with pytest.raises(ValueError, match="step height must be >= 0 nats, got -1"):
        build_position("step(32, -1)", 2, 160)


def test_the_decoder_arm_starts_every_condition_from_one_pretrained_model():
    result = far_decoder.train_seed(0, ["0", "tau", "masked"], 4, 2, 2)
    by = {row["condition"]: row for row in result["rows"]}
    assert result["pretrain"]["step"] == [0, 2, 4]
    assert by["masked"]["far_weight_start"] == 0 and by["masked"]["digit_gradient"] == 0
    assert by["0"]["far_weight_start"] > by["tau"]["far_weight_start"] >= 0 and by["0"]["digit_gradient"] > 0
    assert by["0"]["curve"]["accuracy"][0] == pytest.approx(by["masked"]["curve"]["accuracy"][0], abs=0.2)


def _rows(learned_up_to: float, seeds: int = 5, budget: int = 1000) -> pd.DataFrame:
    rows = []
    for bias in (0.0, 2.0, 4.0, 6.0, 8.0, 12.0, math.inf):
        for seed in range(seeds):
            learned = bias <= learned_up_to
            rows.append({"arm": "adam", "condition": "masked" if math.isinf(bias) else f"{bias:g}", "bias": bias,
                         "seed": seed, "far_weight_start": 0.0 if math.isinf(bias) else math.exp(-bias - 4),
                         "accuracy_start": 0.1, "steps_to_0.9": 10 * 2 ** (bias / 2) if learned else None,
                         "budget": budget, "interval": 1, "same_as_masked": math.isinf(bias),
                         "final_accuracy": 1.0 if learned else 0.1, "constant_accuracy": 0.12,
                         "far_weight_zero_end": 1.0 if math.isinf(bias) else 0.0,
                         "key_gradient": 0.0 if math.isinf(bias) else math.exp(-bias)})  # fmt: skip
    return classify(pd.DataFrame(rows))


def test_the_verdict_is_computed_from_the_rows():
    text = verdict(_rows(learned_up_to=6))
    assert "Every seed reached 0.9 up to B = 6 (starting far weight 4.5e-05); 0 of the 20 runs that did were" in text
    assert "No seed reached it from B = 8 on (starting far weight 6.1e-06): learning stops between B = 6 and 8, " \
           "75-77 nats before the weight is exactly zero" in text  # fmt: skip
    assert "the smallest that learned 4.5e-05 (B = 6, seed 0), the largest that did not reach 0.9 6.1e-06" in text
    assert f"grow by a factor {2**0.5:.2f} per nat" in text
    assert "The fit asks 1.6e+02 steps at B = 8, the budget was 1000: learning stops more abruptly" in text
    assert "Exactly zero from the start at masked: final accuracy 0.10 at most (best constant answer 0.12)" in text
    assert "the gradient reaching the digit there is exactly 0 (5 runs)" in text
    assert "Where learning stops (not a budget's edge): adam B in (6, 8]." in text
    assert "It stops at least 75 nats before exact zero in each of these arms (adam 75)." in text
    assert "Runs that reached 0.9 with a far weight exactly 0 at the start: 0 of 5." in text
    assert "this arm's stop may be its budget's edge" in verdict(_rows(learned_up_to=6, budget=100))
    table = _rows(learned_up_to=6)
    table.loc[(table["bias"] == 2) & (table["seed"] == 1), "final_accuracy"] = 0.3  # reached 0.9, then fell
    table.loc[(table["bias"] == 8) & (table["seed"] == 2), "far_weight_zero_end"] = 0.5  # driven to exact zero
    table.loc[(table["bias"] == 4) & (table["seed"] == 0), "accuracy_start"] = 0.95  # there before training
    text = verdict(classify(table))
    assert "1 runs reached 0.9 and ended below it (B = 2)." in text
    assert "1 runs whose far weight started non-zero ended with it exactly 0 in some held-out episodes (B, seed, " \
           "share: 8, 2, 0.50)" in text  # fmt: skip
    assert "1 of the 20 runs that did were at 0.9 before any training on far episodes" in text
    table.loc[(table["bias"] == 0) & (table["seed"] == 3), "steps_to_0.9"] = None
    assert "The control (B = 0) did not reach 0.9 in every seed: this arm decides nothing." in verdict(classify(table))
    assert dose_table(classify(table)).set_index("condition").loc["0", "answered"] == 4


def test_the_command_keeps_each_record_as_it_finishes_and_continues_from_them(tmp_path, capsys):
    out, runs = tmp_path / "results", tmp_path / "runs"
    command = ["conjecture", "--arms", "adam", "decoder", "--biases", "0", "tau", "masked", "--seeds", "0", "1",
               "--decoder-seeds", "0", "--steps", "20", "--decoder-pretrain", "4", "--decoder-steps", "4", "--decoder-every", "2", "--every",
               "10", "--out", str(out), "--runs", str(runs), "--parallel", "1"]  # fmt: skip
    main([*command, "--hours", "1e-9"])  # a part too short for any run
    assert json.loads((out / "results.json").read_text())["remaining"] == ["adam", "decoder seed 0"]
    main(command)
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 6 and set(summary["seeds"]) == {1, 2} and set(summary["interval"]) == {10, 2}
    assert sorted(p.name for p in (out / "records").iterdir()) == ["adam.json", "decoder-seed-0.json"]
    assert (out / "conjecture.png").stat().st_size > 0 and "## adam" in (out / "verdict.md").read_text()
    results = json.loads((out / "results.json").read_text())
    assert results["remaining"] == [] and [r["arm"] for r in results["runs"]] == ["adam", "decoder"]
    before = (out / "runs.csv").read_text()
    shutil.rmtree(runs)  # a checkout holding only the committed summary folder: nothing to rerun
    capsys.readouterr()
    main(command)
    assert "done in" not in capsys.readouterr().out and (out / "runs.csv").read_text() == before
