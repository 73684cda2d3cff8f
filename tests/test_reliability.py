"""Nothing lost, nothing silent: interrupts save their step, refusals come before training, in one line."""

from __future__ import annotations

import re
import signal

import pytest
from training_runs import refusal, run_cli, scalars, tiny_run_args

EXTRA = {"--data.num_workers": "1", "--trainer.logger.init_args.version": "run"}  # a worker: its state is saved too


@pytest.fixture(scope="module")
def straight_losses(cache_dir, tmp_path_factory) -> dict[int, float]:
    """The uninterrupted 20-step run's losses, which every stopped-and-resumed run below must reproduce."""
    run_dir = tmp_path_factory.mktemp("straight")
    straight = run_cli(["fit", *tiny_run_args(run_dir, cache_dir, **EXTRA)])
    assert straight.returncode == 0, straight.stderr[-3000:]
    return scalars(run_dir, "train/loss")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_saves_its_step_and_the_resume_is_exact(cache_dir, tmp_path, signum, straight_losses):
    args = tiny_run_args(tmp_path / "stopped", cache_dir, **EXTRA)
    stopped = run_cli(["fit", *args, "--trainer.callbacks+=helpers.SignalAtStep", "--trainer.callbacks.step=7",
                       f"--trainer.callbacks.signum={int(signum)}"])  # fmt: skip
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    last = tmp_path / "stopped/alibi/run/checkpoints/last.ckpt"
    name = signal.Signals(signum).name
    assert stopped.stderr.rstrip().splitlines()[-1] == (
        f"blindheads: {name} at step 7: saved {last}; resume with --ckpt_path last"
    )  # the signal lands as step 7 ends: it is saved, and no later step runs
    assert "Traceback" not in stopped.stderr and "DataLoader worker" not in stopped.stderr
    resumed = run_cli(["fit", *args, "--ckpt_path", "last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = scalars(tmp_path / "stopped", "train/loss")
    assert sorted(after) == list(range(20))
    assert after == pytest.approx(straight_losses, rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_a_full_disk_ends_in_one_line_and_last_resumes_from_the_newest_intact_checkpoint(
    cache_dir, tmp_path, straight_losses
):
    """At step 10 the step checkpoint is written, then last.ckpt cannot be (no space): the run ends naming the file,
    the free space and the step-10 checkpoint, and ``--ckpt_path last`` resumes from it (not the step-5 last.ckpt),
    continuing exactly as an uninterrupted run."""
    args = tiny_run_args(tmp_path / "full", cache_dir, **EXTRA)
    full = run_cli(["fit", *args, "--trainer.callbacks+=helpers.DiskFullAtStep", "--trainer.callbacks.step=10"])
    checkpoints = tmp_path / "full/alibi/run/checkpoints"
    last_line = full.stderr.rstrip().splitlines()[-1]
    assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
    assert re.fullmatch(
        rf"blindheads fit: error: no space left on device writing {re.escape(str(checkpoints / 'last.ckpt'))} "
        rf"\([\d.]+ [KMGT]?B free on {re.escape(str(checkpoints))}\): the newest intact checkpoint is "
        rf"{re.escape(str(checkpoints / 'epoch=0-step=10.ckpt'))}; free some space, then resume with --ckpt_path last",
        last_line,
    ), last_line
    assert not list(checkpoints.glob(".*partial*")), "the failed write leaves nothing behind"
    resumed = run_cli(["fit", *args, "--ckpt_path", "last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoints / 'epoch=0-step=10.ckpt'}" in resumed.stderr
    after = scalars(tmp_path / "full", "train/loss")
    assert sorted(after) == [step for step in range(20) if step != 9]  # step 10's loss was logging when it failed
    assert after == pytest.approx({step: straight_losses[step] for step in after}, rel=1e-5, abs=1e-6)


def test_an_evaluation_length_the_prompts_cannot_take_is_refused_before_training(cache_dir, tmp_path):
    """smoke + tiny at 64-token windows: passkey at 0.5x would be 32 tokens, shorter than its fixed parts."""
    args = tiny_run_args(tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "run"})
    message = refusal(["fit", *args, "--trainer.callbacks+=blindheads.callbacks.retrieval.PasskeyEval",
                       "--trainer.callbacks.length_factors=[0.5, 1.0]"])  # fmt: skip
    assert "PasskeyEval at lengths [32, 64]: a prompt of 32 tokens is too short" in message
    assert "\n" not in message
    assert not (tmp_path / "alibi").exists(), "a run refused before its first step leaves no run directory"


def layout_charts(run_dir) -> dict[str, list[str]]:
    """The custom-scalars layout in a run's event files: category -> chart titles."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    (stored,) = events.Tensors(metadata.CONFIG_SUMMARY_TAG)
    parsed = layout_pb2.Layout()
    parsed.ParseFromString(stored.tensor_proto.string_val[0])
    return {category.title: [chart.title for chart in category.chart] for category in parsed.category}


def test_a_run_opens_tensorboard_with_its_layout(trained_run):
    """The tiny model (2 layers, 4 heads): a chart per layer of underflow, one per head of blind distance."""
    charts = layout_charts(trained_run)
    assert charts["underflow: share of weights exactly zero, per layer"] == ["layer 0", "layer 1"]
    assert charts["blind distance: measured (every layer) against predicted"] == [f"head {h}" for h in range(4)]
    assert "exact" in charts["recall by distance"]


def test_last_skips_a_newer_checkpoint_that_is_not_whole(tmp_path):
    import os

    import torch

    from blindheads.cli.checkpoint_files import newest_intact

    torch.save({"state_dict": {}}, tmp_path / "last.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "epoch=0-step=10.ckpt")
    whole = (tmp_path / "epoch=0-step=10.ckpt").read_bytes()
    (tmp_path / "epoch=0-step=15.ckpt").write_bytes(whole[: len(whole) // 2])  # cut short, as a full disk leaves one
    os.utime(tmp_path / "last.ckpt", ns=(1, 1))
    assert newest_intact(tmp_path) == tmp_path / "epoch=0-step=10.ckpt"
    (tmp_path / "epoch=0-step=10.ckpt").unlink()
    assert newest_intact(tmp_path) == tmp_path / "last.ckpt"
    assert newest_intact(tmp_path / "nothing here") is None
