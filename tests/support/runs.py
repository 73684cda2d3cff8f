"""Running real ``blindheads`` CLI jobs from tests (in a subprocess, or in this process), and reading their
TensorBoard logs."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

from blindheads.analysis.runs import run_dirs
from blindheads.analysis.runs import scalars as run_scalars

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def benchmark_module(name: str):
    """``benchmarks/NAME.py`` imported as module ``NAME`` (its dataclasses look their module up in ``sys.modules``),
    removed again afterwards."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


TESTS = Path(__file__).resolve().parents[1]  # on the path of every CLI subprocess: class paths support.NAME resolve


CHECKPOINT_EVERY_5_STEPS = """
callbacks:
  use: [checkpoint]
  checkpoint: {every_n_train_steps: 5}
"""


EVALUATIONS = """
callbacks:
  use: [checkpoint, underflow, gradients, passkey, needle, extrapolation]
  underflow: {every_n_steps: 10, length_factors: [1.0, 4.0]}
  gradients: {every_n_steps: 10}
  passkey: {every_n_steps: 10, lengths: [128, 192], depths: [0.0, 1.0], samples: 3}
  needle: {every_n_steps: 10, lengths: [128, 192], depths: [0.0, 1.0], samples: 3}
  extrapolation: {every_n_steps: 10, factors: [1, 2], sequences: 4}
"""


# A tiny run as the grid makes one (RUNS/alibi/seed3): 2 steps on the builtin corpus, 64-token windows; a test adds
# its callbacks (and data options) in a second config file.
TINY_TESTED_RUN = """
seed_everything: 3
model:
  decoder: {size: tiny, position: alibi, attention: sdpa, dtype: float32, threshold: normal}
  warmup_steps: 1
data:
  source: builtin
  tokenizer: builtin
  seq_len: 64
  batch_size: 2
  num_workers: 0
  val_windows: 2
trainer:
  accelerator: cpu
  devices: 1
  precision: 32-true
  max_steps: 2
  val_check_interval: 2
  check_val_every_n_epoch: null
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {name: alibi, version: seed3}
"""


def tiny_run_args(run_dir: Path, cache_dir: Path, evaluations: bool = False, **overrides) -> list[str]:
    """A tiny fit on the builtin corpus: 4-window batches of 64 tokens, checkpoints every 5 steps, and with
    ``evaluations`` the underflow, retrieval and extrapolation callbacks every 10 steps."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints.yaml").write_text(CHECKPOINT_EVERY_5_STEPS)
    if evaluations:  # composed after checkpoints.yaml: it names the callbacks' evaluation arguments only
        (run_dir / "evaluations.yaml").write_text(EVALUATIONS)
    options = {
        "--data.cache_dir": str(cache_dir),
        "--data.seq_len": "64",
        "--data.batch_size": "4",
        "--data.num_workers": "0",
        "--data.val_windows": "8",
        "--model.warmup_steps": "5",
        "--trainer.max_steps": "20",
        "--trainer.val_check_interval": "10",
        "--trainer.log_every_n_steps": "1",
        "--trainer.logger.init_args.save_dir": str(run_dir),
        "--trainer.enable_progress_bar": "false",
        **overrides,
    }
    args = [
        "--config",
        str(REPO / "configs/smoke.yaml"),
        "--config",
        str(REPO / "configs/size/tiny.yaml"),
        "--config",
        str(run_dir / "checkpoints.yaml"),
        *(["--config", str(run_dir / "evaluations.yaml")] if evaluations else []),
    ]
    for key, value in options.items():
        args += [key, value]
    return args


def run_cli(args: list[str], env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m blindheads ARGS`` in its own process group (so a test can kill every rank at once)."""
    environment = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "blindheads", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout,
        start_new_session=True,
    )


def scalars(log_dir: Path, tag: str) -> dict[int, float]:
    """Every value of ``tag`` in every run below ``log_dir``, by step (no sampling)."""
    values = {}
    for run in run_dirs(log_dir):
        frame = run_scalars(run)
        values.update(frame.loc[frame["tag"] == tag].set_index("step")["value"].to_dict())
    return values


def copy_run(run_dir: Path, root: Path) -> Path:
    """A writable copy of ``run_dir`` (``.../NAME/VERSION``) at ``root/NAME/VERSION``, where tiny_run_args(root)
    puts a run of that name and version."""
    target = root / run_dir.parent.name / run_dir.name
    shutil.copytree(run_dir, target)
    return target


def in_process(args: list[str]) -> tuple[int, str, str]:
    """``blindheads ARGS`` run in this process (no interpreter start-up, no imports paid again), as the console runs
    it: the exit code (0 when it returns; a ``SystemExit`` message is written to stderr with code 1, as Python does),
    and what it wrote to stdout and stderr. Any other exception propagates: a traceback fails the test. For parsing,
    refusals and printed configs; a test of the process itself (signals, kills, DDP, imports) uses ``run_cli``."""
    from blindheads.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(args)
            code = 0
        except SystemExit as exit:
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
    return code, stdout.getvalue(), stderr.getvalue()


def refusal(args: list[str]) -> str:
    """The one-line refusal of ``blindheads ARGS``, run in this process (parsing and set-up cost no start-up): the
    message it exits with; fails if the command ends any other way."""
    from blindheads.cli import main

    try:
        main(args)
    except SystemExit as exit:
        assert isinstance(exit.code, str), f"exited with {exit.code!r}, not a message"
        return exit.code
    raise AssertionError(f"blindheads {' '.join(args)} was not refused")
