"""``blindheads grid`` end to end at a few steps: two setups, tested and summarised; a second call resumes."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from training_runs import REPO, run_cli


@pytest.mark.slow
def test_a_two_setup_grid_trains_tests_summarises_and_resumes(cache_dir, tmp_path):
    out = tmp_path / "grid"
    shrink = ["--data.cache_dir", str(cache_dir), "--trainer.max_steps", "3", "--data.batch_size", "2",
              "--data.val_windows", "2"]  # fmt: skip
    command = ["grid", "--config", str(REPO / "configs/experiments/laptop.yaml"), "--setups", "alibi", "nope",
               "--seeds", "0", "--out", str(out), "--runs", str(tmp_path / "runs"), "--", *shrink]  # fmt: skip
    first = run_cli(command)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    summary = pd.read_csv(out / "summary.csv", index_col=0)
    assert list(summary.index) == ["alibi", "nope"] and (summary["seeds"] == 1).all()
    assert summary[["loss_1x", "loss_2x", "loss_4x", "passkey_auc_in", "needle_auc_out"]].notna().all().all()
    assert summary.loc["nope", "underflow_1x"] == 0  # no bias, no zero weights
    assert "| alibi | 1 |" in (out / "summary.md").read_text()
    for figure in ("retrieval_auc.png", "loss_by_length.png", "underflow_per_head.png"):
        assert (out / figure).stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0] and results["versions"]["torch"] and len(results["runs"]) == 2
    assert {r["setup"]: r["global_step"] for r in results["runs"]} == {"alibi": 3, "nope": 3}

    (tmp_path / "runs/nope/seed0/results.json").unlink()  # as if killed before nope's test ended
    fit_log = tmp_path / "runs/alibi/seed0.fit.log"
    before = fit_log.stat().st_mtime_ns
    second = run_cli(command)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert fit_log.stat().st_mtime_ns == before, "a finished run is not run again"
    assert "nope seed 0: done" in second.stdout and "alibi seed 0: done" not in second.stdout
    assert "resuming from" in (tmp_path / "runs/nope/seed0.fit.log").read_text()


def test_unknown_setups_are_refused_with_the_choices():
    result = run_cli(["grid", "--setups", "alibi", "bogus"])
    assert result.returncode != 0 and "unknown setups ['bogus']; valid: nope, rope, alibi" in result.stderr


@pytest.mark.slow
def test_the_conjecture_command_measures_exact_zeros_under_blindness(cache_dir, tmp_path):
    out = tmp_path / "conjecture"
    shrink = ["--data.cache_dir", str(cache_dir), "--data.batch_size", "2", "--data.val_windows", "2"]
    command = ["conjecture", "--conditions", "zero", "nope", "--steps", "4", "--every", "2", "--out", str(out),
               "--runs", str(tmp_path / "runs"), "--", *shrink]  # fmt: skip
    result = run_cli(command)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = pd.read_csv(out / "summary.csv", index_col=0)
    assert summary.loc["zero", "far_weights_exactly_zero"] == summary.loc["zero", "far_weights"] == 16
    assert summary.loc["nope", "far_weights_exactly_zero"] == 0 and summary.loc["nope", "far_weight_max"] > 0
    assert (out / "conjecture.png").stat().st_size > 0
    assert json.loads((out / "results.json").read_text())["summary"]["zero"]["far_weights"] == 16
