"""benchmarks/gpu_check.py: every part's code runs at tiny size on the CPU, so a GPU's first run cannot fail on a typo."""

from __future__ import annotations

import json

import pytest
import torch
from support.runs import benchmark_module


@pytest.fixture(scope="module")
def gpu_check():
    with benchmark_module("gpu_check") as module:
        yield module


@pytest.mark.slow
def test_smoke_runs_every_part_on_the_cpu(gpu_check, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: run the check itself")
    out = tmp_path / "check.json"
    assert gpu_check.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["seconds"]) == set(gpu_check.PARTS) and not report["skipped"]
    assert len(report["backends"]) == len(gpu_check.SPECS)
    assert all(row["sdpa_output"] < 1e-4 and row["sdpa_grad"] < 1e-4 for row in report["backends"])
    assert [row["spec"] for row in report["training"]] == gpu_check.TRAINING
    assert all(row["tokens_per_s"] > 0 and row["peak_memory_gib"] is None for row in report["training"])
    float32 = next(row for row in report["zero_thresholds"] if row["dtype"] == "float32")
    assert min(abs(float32["eager"] - float32[mode]) for mode in ("tau_normal", "tau_subnormal")) < 0.05
    assert report["probe_7b"]["layers_measured"] == 2 and report["probe_7b"]["peak_gib"] is None
    assert "backends ~120 s" in capsys.readouterr().out, "the plan is printed before the first part"


def test_a_budget_skips_the_parts_that_would_not_fit_and_says_so(gpu_check, tmp_path, monkeypatch):
    ran = []
    for part in gpu_check.PARTS:
        monkeypatch.setitem(gpu_check.PARTS, part, lambda target, args, part=part: ran.append(part) or {"ok": 1})
    out = tmp_path / "check.json"
    assert gpu_check.main(["--smoke", "--budget-s", "200", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert ran == ["backends", "zero_thresholds", "probe_7b"]  # training's 240 s did not fit in what was left
    assert report["skipped"] == {"training": "expected 240 s, 200 s of the budget left"}


def test_without_a_gpu_or_smoke_nothing_is_faked(gpu_check, capsys):
    args = gpu_check.parse_args(["--steps", "3", "--batch", "2", "--out", "x.json"])
    assert (args.steps, args.batch, args.out, args.layers, args.smoke) == (3, 2, "x.json", 30, False)
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: run the check itself")
    assert gpu_check.main([]) == 2
    assert "no CUDA GPU here; nothing was measured" in capsys.readouterr().err
