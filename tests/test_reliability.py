"""Nothing lost, nothing silent: interrupts save their step, refusals come before training, in one line."""

from __future__ import annotations

import re
import signal

import pytest
from support.runs import CHECKPOINT_EVERY_5_STEPS, copy_run, refusal, run_cli, scalars, tiny_run_args

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
    stopped = run_cli(["fit", *args, "--trainer.callbacks+=support.callbacks.SignalAtStep", "--trainer.callbacks.step=7",
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
    full = run_cli(
        ["fit", *args, "--trainer.callbacks+=support.callbacks.DiskFullAtStep", "--trainer.callbacks.step=10"]
    )
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


def layout_charts(run_dir) -> dict[str, dict[str, list[str]]]:
    """The custom-scalars layout a run's newest event file holds: category -> chart title -> tag regexes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    newest = sorted(run_dir.glob("events.out.tfevents.*"), key=lambda p: int(p.name.split(".")[3]))[-1]
    events = EventAccumulator(str(newest), size_guidance={"tensors": 0})
    events.Reload()
    (stored,) = events.Tensors(metadata.CONFIG_SUMMARY_TAG)
    parsed = layout_pb2.Layout()
    parsed.ParseFromString(stored.tensor_proto.string_val[0])
    return {
        category.title: {chart.title: list(chart.multiline.tag) for chart in category.chart}
        for category in parsed.category
    }


def assert_every_chart_draws_a_tag(run_dir) -> dict[str, dict[str, list[str]]]:
    """TensorBoard matches a chart's regexes from the start of each tag; one that matches none is an empty chart."""
    from blindheads.analysis.runs import scalars as all_scalars

    tags = set(all_scalars(run_dir)["tag"])
    charts = layout_charts(run_dir)
    empty = [
        f"{category} / {title}"
        for category, titled in charts.items()
        for title, patterns in titled.items()
        if not any(re.match("|".join(f"({p})" for p in patterns), tag) for tag in tags)
    ]
    assert not empty, f"charts drawing no tag: {empty}"
    return charts


def test_a_run_opens_tensorboard_with_charts_of_the_tags_it_writes(trained_run):
    """The tiny model (2 layers, 4 heads, 64-token windows, underflow at 1x and 4x, evaluations at steps 10 and 20):
    no head is blind within 256 tokens (predicted from 343 on), so there is no blind-distance chart; fixed slopes
    predict the same blind distances at every step, so fit logs them only in the image; a chart holds one line where
    its lines would need telling apart (TensorBoard gives one run's lines one colour); the images come at each
    evaluation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from blindheads.analysis.runs import scalars as all_scalars
    from blindheads.evaluation.tags import PREDICTED, UNDERFLOW_MEAN, at_stage

    charts = assert_every_chart_draws_a_tag(trained_run)
    underflow = "underflow: share of causal weights exactly zero, mean over layers and heads"
    assert list(charts[underflow]) == ["mean at 64 tokens (1x)", "mean at 256 tokens (4x)"]
    assert all(len(patterns) == 1 for patterns in charts[underflow].values())
    assert not [category for category in charts if category.startswith("blind distance")]
    assert "recall by distance" not in charts  # the run has no EpisodeRecall
    assert list(charts["loss"]) == [
        "train (text and retrieval episodes)",
        "held-out text (validation, test)",
        "held-out at 64 tokens (1x)",
        "held-out at 128 tokens (2x)",
    ]
    tags = set(all_scalars(trained_run)["tag"])
    assert not at_stage(PREDICTED, tags, "") and len(at_stage(UNDERFLOW_MEAN, tags, "")) == 2
    (events,) = trained_run.glob("events.out.tfevents.*")
    images = EventAccumulator(str(events), size_guidance={"images": 0})
    images.Reload()
    for tag in ("blind_distance/by_head", "underflow/by_distance", "underflow/heatmap"):
        assert [image.step for image in images.Images(tag)] == [10, 20], tag
    assert list(charts["retrieval"]) == [
        "passkey, exact by length and depth",
        "needle, exact by length and depth",
        "AUC in and beyond the training length",
    ]


def test_a_head_blind_at_the_longest_length_gets_a_measured_chart_per_layer(trained_run, cache_dir, tmp_path):
    """``test`` at 8x (512 tokens), where head 0 (slope 1/4) goes blind: its measured blind distance is a chart per
    layer (TensorBoard gives every line of one run one colour), and recall by distance a chart per point
    EpisodeRecall writes."""
    from blindheads.cli import main

    run_dir = copy_run(trained_run, tmp_path)
    args = tiny_run_args(tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "run"})
    (tmp_path / "checkpoints.yaml").write_text(CHECKPOINT_EVERY_5_STEPS + """
  underflow: {length_factors: [1.0, 8.0]}
  recall: {gaps: [], distances: [0.5, 2.0], samples: 2}
data:
  retrieval_mix: {facts: 1, value_digits: [1, 1], max_gap: 16}  # episodes that fit the 64-token window
""")  # fmt: skip
    main(["test", *args, "--callbacks.use=[checkpoint, underflow, recall]", "--ckpt_path", "last"])
    charts = assert_every_chart_draws_a_tag(run_dir)
    distances = charts["blind distance at 512 tokens: measured in eager weights (q.k included)"]
    assert list(distances) == ["head 0, layer 0: measured", "head 0, layer 1: measured"]  # fixed slopes: no predicted
    assert list(charts["recall by distance"]) == [
        "exact at 32 tokens (distance0.5x)",
        "exact at 128 tokens (distance2x)",
    ]
    assert (
        "mean at 512 tokens (8x)"
        in charts["underflow: share of causal weights exactly zero, mean over layers and heads"]
    )


def test_last_skips_a_newer_checkpoint_that_is_not_whole(tmp_path):
    import os

    import torch

    from blindheads.checkpoints.reading import newest_intact

    torch.save({"state_dict": {}}, tmp_path / "last.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "epoch=0-step=10.ckpt")
    whole = (tmp_path / "epoch=0-step=10.ckpt").read_bytes()
    (tmp_path / "epoch=0-step=15.ckpt").write_bytes(whole[: len(whole) // 2])  # cut short, as a full disk leaves one
    os.utime(tmp_path / "last.ckpt", ns=(1, 1))
    assert newest_intact(tmp_path) == tmp_path / "epoch=0-step=10.ckpt"
    (tmp_path / "epoch=0-step=10.ckpt").unlink()
    assert newest_intact(tmp_path) == tmp_path / "last.ckpt"
    assert newest_intact(tmp_path / "nothing here") is None


def test_the_progress_bar_counts_steps_where_the_run_is_bounded_by_steps(cache_dir, tmp_path, capsys):
    """``max_steps`` on a stream leaves ``max_epochs`` at -1, which Lightning's default bar showed as ``Epoch 0/-2``.
    A resumed run (mid-epoch: no epoch starts) counts on from its checkpoint's step."""
    from blindheads.cli import main

    bar = {"--trainer.limit_val_batches": "0", "--trainer.enable_progress_bar": "true"}
    args = tiny_run_args(tmp_path, cache_dir, **bar, **{"--trainer.logger.init_args.version": "run"})
    main(["fit", *args, "--trainer.max_steps", "5"])  # checkpointed at step 5
    shown = capsys.readouterr().out
    assert "step:  20%" in shown and " 1/5 [" in shown and "step: 100%" in shown and " 5/5 [" in shown, shown[-2000:]
    main(["fit", *args, "--trainer.max_steps", "6", "--ckpt_path", "last"])
    shown += capsys.readouterr().out
    assert " 5/6 [" in shown and " 6/6 [" in shown, shown[-2000:]
    assert "Epoch" not in shown
