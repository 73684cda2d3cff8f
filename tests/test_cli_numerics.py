"""The run's numeric regime comes from its config: the dtype must match the precision, the threshold sets the CPU flag."""

from __future__ import annotations

import pytest
import torch
from support.runs import REPO, in_process

from blindheads.cli.lightning import build_cli


def flushes() -> bool:
    return (torch.tensor([1e-39]) * torch.tensor([1.0])).item() == 0.0


@pytest.mark.parametrize("threshold, flushed", [("normal", True), ("subnormal", False)])
def test_the_threshold_sets_the_subnormal_flag(cache_dir, threshold, flushed, monkeypatch):
    monkeypatch.chdir(REPO)
    try:
        build_cli(["--config", "configs/smoke.yaml", "--model.decoder.threshold", threshold, "--data.cache_dir",
                   str(cache_dir), "--trainer.logger", "false"], run=False)  # fmt: skip
        assert flushes() == flushed
    finally:
        torch.set_flush_denormal(False)


def test_a_precision_that_contradicts_the_dtype_is_refused_in_one_line(cache_dir):
    code, _, stderr = in_process(["fit", "--config", str(REPO / "configs/smoke.yaml"), "--model.decoder.dtype",
                                  "bfloat16", "--data.cache_dir", str(cache_dir)])  # fmt: skip
    assert code == 1 and len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith(
        "blindheads fit: error: --trainer.precision 32-true computes attention in float32, but --model.decoder.dtype "
        "is bfloat16"
    ), stderr
