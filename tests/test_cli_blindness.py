"""``blindheads blindness`` through the command's entry point (``blindheads.cli.main``), in this process."""

import json
import math
import os
import signal
import sys

import pytest
import torch
from support.runs import in_process

from blindheads import blindness
from blindheads.cli import main
from blindheads.modules.position import build_position
from blindheads.numerics import tau


def test_json_output_has_the_documented_keys(capsys):
    main(["blindness", "--heads", "8", "--context", "1024", "--dtype", "float32", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["tau"] == pytest.approx(tau("float32"))
    assert len(report["heads"]) == 8
    head = report["heads"][0]
    assert set(head) == {"slope", "blind_distance", "horizon_distance", "underflow_last_query", "underflow_all_pairs"}
    assert head["slope"] == pytest.approx(0.5) and head["blind_distance"] == pytest.approx(tau("float32") / 0.5)
    assert report["heads"][-1]["blind_distance"] > 1024 and report["heads"][-1]["underflow_last_query"] == 0
    assert 0 <= report["underflow_all_pairs"] <= report["underflow_last_query"] <= 1


def strict_json(constant: str):
    """What a strict JSON parser does with ``Infinity`` or ``NaN``: refuse it."""
    raise AssertionError(f"{constant} is not JSON")


def test_threshold_and_bias_change_the_answer(capsys):
    main(
        [
            "blindness",
            "--heads",
            "4",
            "--context",
            "512",
            "--dtype",
            "float16",
            "--threshold",
            "subnormal",
            "--bias",
            "alibi(wide)+clamp",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out, parse_constant=strict_json)
    assert report["tau"] == pytest.approx(tau("float16", "subnormal"))
    assert report["underflow_last_query"] == 0.0 and all(h["blind_distance"] is None for h in report["heads"])
    # what a real float16 softmax of that bias does (subnormals kept): no weight is zero
    stack = build_position("alibi(wide)+clamp", 4, 512, "float16", "subnormal")
    assert (torch.softmax(stack.dense_bias(1, 512, "cpu")[:, 0].half(), dim=-1) == 0).sum() == 0
    # without the clamp the same heads go blind, in the calculator and in the softmax alike
    main(
        [
            "blindness",
            "--heads",
            "4",
            "--context",
            "512",
            "--dtype",
            "float16",
            "--threshold",
            "subnormal",
            "--bias",
            "alibi(wide)",
            "--softmax",
            "materialized",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    stack = build_position("alibi(wide)", 4, 512, "float16", "subnormal")
    zeros = (torch.softmax(stack.dense_bias(1, 512, "cpu")[:, 0].half(), dim=-1) == 0).sum(-1)
    assert [round(h["underflow_last_query"] * 512) for h in report["heads"]] == pytest.approx(zeros.tolist(), abs=1)
    assert zeros.sum() > 0


def test_softmax_definitions_share_their_keys(capsys):
    reports = {}
    for softmax in ("fused", "materialized"):
        main(["blindness", "--heads", "9", "--context", "2048", "--softmax", softmax, "--json"])
        reports[softmax] = json.loads(capsys.readouterr().out)
    fused, materialized = reports["fused"], reports["materialized"]
    assert set(fused) == set(materialized) and fused["softmax"] == "fused"
    assert [set(h) for h in fused["heads"]] == [set(h) for h in materialized["heads"]]
    assert all(m["blind_distance"] < f["blind_distance"] for f, m in zip(fused["heads"], materialized["heads"]))


def test_config_file(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("model:\n  decoder:\n    size: tiny\n    position: alibi(steep)\n")
    main(["blindness", "--config", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert len(report["heads"]) == 4 and report["context"] == 128
    assert report["heads"][0]["blind_distance"] == pytest.approx(128, rel=1e-6)


def test_table_through_the_entry_point():
    code, stdout, stderr = in_process(["blindness", "--heads", "9", "--context", "2048"])
    assert code == 0 and stderr == "", stderr
    lines = stdout.splitlines()
    assert "tau: 87.3365" in lines[0] and len(lines) == 2 + 9 + 1
    assert lines[-1].startswith("mean")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--heads", "4", "--bias", "alibix"], "unknown position component 'alibix'; valid: alibi, clamp, fire"),
        (["--heads", "4", "--dtype", "int8"], "invalid choice: 'int8'"),
        (["--heads", "4", "--softmax", "flash"], "invalid choice: 'flash'"),
        (["--heads", "0"], "--heads must be between 1 and 4096, got 0"),
        (["--heads", "100000000", "--context", "1000000000000"], "--heads must be between 1 and 4096"),
        (["--heads", "4", "--context", "0"], "--context must be between 1 and 1099511627776 tokens, got 0"),
        (["--heads", "4", "--context", "-5"], "--context must be between 1"),
        (["--heads", "2", "--bias", "alibi([1e999, 0.5])"], "ALiBi slopes must be positive and finite, got [inf, 0.5]"),
        *(  # a slope finite as a Python float but inf in float32: it was reported as never blind (null)
            (
                f"--heads 2 --context 64 --bias alibi([1e39,0.5]) --dtype float32 --softmax {softmax} --json".split(),
                "ALiBi slopes must be positive and finite in float32 (from 1.401e-45 up to 3.403e+38), got [1e+39, 0.5]",
            )
            for softmax in ("materialized", "fused")
        ),
        (["--heads", "2", "--bias", "alibi([1e5, 0.5])", "--dtype", "float16"], "finite in float16"),
        (
            ["--heads", "4", "--bias", "alibi(alibi_bias_max=4)"],
            "alibi alibi_bias_max=4 is used only by slopes=mpt (MPT's exponent range), not by slopes=press: give "
            "slopes=mpt or drop it",
        ),
        (
            ["--heads", "4", "--bias", "alibi(wide, alibi_bias_max=-8)"],
            "not by slopes=wide: give slopes=mpt or drop it",
        ),
        (["--heads", "4", "--bias", "alibi(mpt, alibi_bias_max=-8)"], "alibi alibi_bias_max must be > 0, got -8"),
        (["--heads", "4", "--bias", "alibi(mpt, alibi_bias_max=nan)"], "alibi alibi_bias_max must be finite, got nan"),
        (["--heads", "4", "--bias", "alibi(alibi_bias_max=1e400)"], "alibi alibi_bias_max must be finite, got inf"),
        (
            ["--heads", "4", "--bias", "alibi(slopes=press, blind_distances=[8, 16, 32, 64])"],
            "alibi takes slopes (press) or blind_distances ([8, 16, 32, 64]), not both",
        ),
        (["--heads", "4", "--bias", "alibi+clamp(floor=-1e400)"], "clamp floor must be finite, got -inf"),
        (["--heads", "4", "--bias", "rope(theta=nan)"], "rope theta must be finite, got nan"),
        (["--heads", "4", "--bias", "alibi+soft_cap(inf)"], "soft_cap cap must be finite, got inf"),
        (
            ["--heads", "2", "--bias", "alibi+log_distance", "--context", "1000000000000", "--softmax", "materialized"],
            "the materialized normaliser does not converge",
        ),
        (["--context", "10"], "give --heads"),
        (["--config", "/no/such.yaml"], "does not exist"),
    ],
)
def test_bad_input_is_a_clear_error(args, message, capsys, monkeypatch):
    monkeypatch.setattr(blindness, "MAX_CHUNKS", 2)  # the normaliser's refusal after 2 chunks, not 512
    with pytest.raises(SystemExit) as exit:  # any other exception fails the test: it would be a traceback
        main(["blindness", *args])
    said = exit.value.code if isinstance(exit.value.code, str) else capsys.readouterr().err
    assert exit.value.code not in (0, None) and message in said, said


def test_any_context_in_closed_form_or_bounded_memory(capsys):
    for softmax in ("fused", "materialized"):
        main(["blindness", "--heads", "9", "--context", "1000000000000", "--softmax", softmax, "--json"])
        report = json.loads(capsys.readouterr().out)
        assert report["context"] == 10**12 and report["underflow_last_query"] > 0.99


def test_help_lists_the_commands_and_succeeds():
    code, stdout, _ = in_process(["--help"])
    assert code == 0
    for command in ("blindness", "fit", "validate", "test", "probe", "export", "lm_eval"):
        assert f"  {command} " in stdout


def first_zero_distance(slope: float, dtype: torch.dtype) -> int:
    """Independent reference: the first distance whose bias alone, exponentiated in ``dtype`` with subnormals kept
    (the process default here), is exactly 0 (the fused definition)."""
    distances = torch.arange(0, 4096, dtype=torch.float64)
    weights = torch.exp((-slope * distances).to(dtype))
    return int(distances[weights == 0][0])


def test_a_config_files_dtype_and_threshold_are_used_and_explicit_flags_win(tmp_path, capsys):
    config = tmp_path / "float32-subnormal.yaml"
    config.write_text("model:\n  decoder:\n    num_heads: 8\n    num_kv_heads: 8\n    dtype: float32\n"
                      "    threshold: subnormal\n")  # fmt: skip
    main(["blindness", "--config", str(config), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert (report["dtype"], report["threshold"]) == ("float32", "subnormal")
    head = report["heads"][0]
    assert math.floor(head["blind_distance"]) + 1 == first_zero_distance(head["slope"], torch.float32) == 208
    main(["blindness", "--config", str(config), "--dtype", "bfloat16", "--threshold", "normal", "--json"])
    flagged = json.loads(capsys.readouterr().out)
    assert (flagged["dtype"], flagged["threshold"]) == ("bfloat16", "normal")
    assert flagged["heads"][0]["blind_distance"] == pytest.approx(tau("bfloat16") / 0.5)


def test_config_files_stack_as_in_fit_later_ones_winning(capsys, tmp_path):
    kept = tmp_path / "subnormal.yaml"
    kept.write_text("model:\n  decoder:\n    threshold: subnormal\n")
    stacked = ["configs/experiments/laptop.yaml", "configs/experiments/dense_recall.yaml", str(kept)]
    main(["blindness", *(arg for file in stacked for arg in ("--config", file)), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert (report["dtype"], report["threshold"], report["context"]) == ("float32", "subnormal", 64)  # the last wins
    head = report["heads"][0]
    assert math.floor(head["blind_distance"]) + 1 == first_zero_distance(head["slope"], torch.float32)


def test_a_reader_that_stops_early_ends_the_table_quietly(monkeypatch):
    """``blindheads blindness | head -1``: the reader closes the pipe, the next write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed_pipe:
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        with pytest.raises(SystemExit) as exit:  # any other exception fails the test: it would be a traceback
            main(["blindness", "--heads", "8"])
    assert exit.value.code == 128 + signal.SIGPIPE
