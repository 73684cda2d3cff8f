"""Tokens/s of a real CPU ``fit`` step, the share of step time spent outside the training step (data, logging,
callbacks), and the overhead of each evaluation callback at its interval.

    python benchmarks/training_throughput.py [--steps 30] [--big-steps 3]

Goals: outside share <= 5%; underflow monitor <= 3% of training time at its default interval (500 steps).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import lightning as L
import torch

from blindheads.callbacks.extrapolation import LengthExtrapolation
from blindheads.callbacks.gradient_blindness import GradientBlindness
from blindheads.callbacks.retrieval import NeedleEval, PasskeyEval
from blindheads.callbacks.underflow import UnderflowMonitor
from blindheads.cli.lightning import build_cli


class StepTimer(L.Callback):
    """Wall time of each whole step (batch start to next batch start) and of its training step proper."""

    def __init__(self) -> None:
        self.starts, self.inside = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.inside.append(time.perf_counter() - self.starts[-1])

    def summary(self, skip: int = 2) -> tuple[float, float]:
        steps = [b - a for a, b in zip(self.starts[skip:], self.starts[skip + 1 :])]
        inside = self.inside[skip : skip + len(steps)]
        return statistics.median(steps), 1 - sum(inside) / sum(steps)


def fit(args: list[str], steps: int) -> tuple[L.LightningModule, L.Trainer, StepTimer]:
    timer = StepTimer()
    cli = build_cli(
        [
            *args,
            f"--trainer.max_steps={steps}",
            "--trainer.val_check_interval=100000",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ],
        run=False,
    )
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model, cli.trainer, timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--big-steps", type=int, default=4)
    args = parser.parse_args()
    root = tempfile.mkdtemp()
    base = [
        "--config",
        "configs/smoke.yaml",
        f"--trainer.logger.init_args.save_dir={root}",
        "--callbacks.use=[throughput, lr_monitor]",
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    shapes = {
        "smoke (4 x 128, 8 heads)": [],
        "smollm-148m (30 x 576, 148M)": [
            "--config",
            "configs/experiments/paper.yaml",
            "--config",
            "configs/trainer/cpu.yaml",
            "--data.source=builtin",
            "--data.tokenizer=builtin",
            "--data.seq_len=512",
            "--data.batch_size=1",
            "--data.num_workers=1",
            "--data.val_windows=8",
            "--model.compile=false",
            "--model.decoder.attention=sdpa",
            "--model.decoder.dtype=float32",
            "--trainer.strategy=auto",
            "--callbacks.use=[]",
            f"--trainer.logger.init_args.save_dir={root}",
        ],
    }
    for name, extra in shapes.items():
        steps = args.steps if not extra else args.big_steps
        model, trainer, timer = fit(base + extra, steps)
        step, outside = timer.summary(skip=2 if not extra else 1)
        tokens = trainer.datamodule.batch_size * trainer.datamodule.seq_len
        print(
            f"{name:<30} {tokens / step:>9,.0f} tokens/s  step {step * 1000:>8.1f} ms  outside training step "
            f"{outside:.1%}"
        )
        if extra:
            continue
        grid = {"length_factors": [0.5, 1.0, 2.0, 4.0], "depths": [0.0, 0.5, 1.0]}  # the smoke config's
        for callback, interval in (
            (UnderflowMonitor(), 500),
            (GradientBlindness(), 500),
            (PasskeyEval(**grid), 500),
            (NeedleEval(**grid), 500),
            (LengthExtrapolation(), 500),
        ):
            start = time.perf_counter()
            callback.evaluate(trainer, model)
            seconds = time.perf_counter() - start
            print(
                f"  {type(callback).__name__:<20} {seconds:6.2f} s per run = {seconds / (interval * step):.1%} of "
                f"training time every {interval} steps"
            )


if __name__ == "__main__":
    main()
