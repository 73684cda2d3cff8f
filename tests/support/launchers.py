"""What the launcher tests share: a tiny grid's command line and a fixture that lets the jobs' fits import test
support (``support.callbacks.SlowSteps``) and find the builtin corpus."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blindheads.experiments.driver import launchers
from support.runs import REPO, TESTS


def grid(tmp_path: Path, runs: str, setups: list[str], steps: int, *launcher: str) -> list[str]:
    shrink = ["--callbacks.use", "[checkpoint, underflow, extrapolation]", "--callbacks.checkpoint.every_n_train_steps",
              str(steps), "--callbacks.extrapolation.sequences", "2", "--data.batch_size", "2", "--data.val_windows", "2", "--trainer.max_steps", str(steps),
              "--trainer.val_check_interval", str(steps), "--trainer.callbacks+=support.callbacks.SlowSteps"]  # fmt: skip
    return ["grid", "--config", str(REPO / "configs/experiments/laptop.yaml"), "--setups", *setups, "--seeds", "0",
            "--runs", str(tmp_path / runs), *launcher, "--", "--data.cache_dir", str(tmp_path.parent / "cache"),
            *shrink]  # fmt: skip


@pytest.fixture
def jobs_see_the_tests(monkeypatch, cache_dir, tmp_path):
    """The jobs' fits import this module's callback; the builtin corpus beside ``tmp_path``."""
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(launchers, "POLL_S", 1.0)
    (tmp_path.parent / "cache").exists() or (tmp_path.parent / "cache").symlink_to(cache_dir)
