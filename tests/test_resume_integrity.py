"""A run directory after the fit that made it: ``test`` and resumes leave its ``config.yaml`` as the fit wrote it, a
copied run resumes into its own ``last.ckpt``, ``--ckpt_path last`` takes the latest step, and what cannot run from a
checkpoint is refused in one line before anything is written."""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import pytest
import torch
import yaml
from support.runs import REPO, copy_run, refusal, tiny_run_args

from blindheads.checkpoints.reading import newest_intact, recorded_step
from blindheads.cli import main

RUN = {"--trainer.logger.init_args.version": "run"}


@pytest.fixture
def copied(trained_run, cache_dir, tmp_path):
    """A copy of the shared 20-step run (``cp -r``), and the options of the tiny run that resume it in place."""
    return copy_run(trained_run, tmp_path), tiny_run_args(tmp_path, cache_dir, **RUN)


def test_test_and_a_resume_leave_the_fits_config_yaml_and_write_their_own(copied, caplog):
    """``test --seed_everything 7 --trainer.max_steps 99`` rewrote the fit's seed and steps in config.yaml. Here the
    copied run's resume also keeps writing last.ckpt, not last-v1.ckpt beside a stale one."""
    run, args = copied
    fit = (run / "config.yaml").read_bytes()
    main(["test", *args, "--ckpt_path", "last", "--seed_everything", "7", "--trainer.max_steps", "99"])
    tested = yaml.safe_load((run / "config.test.yaml").read_text())
    assert tested["seed_everything"] == 7 and tested["trainer"]["max_steps"] == 99
    assert (
        f"config.test.yaml differs from {run / 'config.yaml'} (the run's first record, kept as it was) in: "
        in caplog.text
    )
    assert "seed_everything 1234 -> 7; " in caplog.text and "trainer.max_steps 20 -> 99" in caplog.text

    main(["fit", *args, "--ckpt_path", "last", "--trainer.max_steps", "25"])
    assert (run / "config.resume-20.yaml").is_file() and (run / "config.yaml").read_bytes() == fit
    assert sorted(p.name for p in (run / "checkpoints").glob("last*")) == ["last.ckpt"]
    assert recorded_step(run / "checkpoints/last.ckpt") == 25


def test_a_resume_into_another_setup_names_only_what_differs_and_asks_for_what_it_accepts(copied, caplog):
    """Resumed with configs/position/rope.yaml, a bf16 precision and fewer steps: the position is the one model
    option named (not the shape the size preset fills in); the precision advice is one the resume takes; then the
    steps are refused, naming both numbers."""
    run, args = copied
    last = run / "checkpoints/last.ckpt"
    rope = ["--config", str(REPO / "configs/position/rope.yaml"), "--ckpt_path", str(last)]
    with caplog.at_level(logging.WARNING, logger="blindheads.cli.lightning"):
        message = refusal(["fit", *args, *rope, "--trainer.precision", "bf16-mixed"])
    replaced = [r.getMessage() for r in caplog.records if "replaced by the checkpoint's" in r.getMessage()]
    assert replaced == [
        "model option replaced by the checkpoint's: model.decoder.position: 'rope' given, the checkpoint's 'alibi' used"
    ]
    assert message == (
        f"blindheads fit: error: --trainer.precision bf16-mixed computes attention in bfloat16, but the checkpoint "
        f"{last} computes in float32 (its model.decoder.dtype, which a run from a checkpoint keeps): give a precision "
        "that computes in float32 (32-true, 32)"
    )
    message = refusal(["fit", *args, *rope, "--trainer.precision", "32-true", "--trainer.max_steps", "15"])
    assert message == (
        f"blindheads fit: error: --trainer.max_steps 15 is below the checkpoint's step 20 ({last}): a resume trains "
        "on from there to --trainer.max_steps, so give more steps; validate or test evaluate the checkpoint"
    )
    assert not (run.parent.parent / "rope").exists(), "refused before a run directory was made"


def test_last_is_the_latest_step_not_the_latest_file(copied, tmp_path):
    """An older checkpoint touched after the newer ones (restored from a backup) is not the one resumed."""
    run, args = copied
    os.utime(run / "checkpoints/epoch=0-step=10.ckpt")
    assert recorded_step(newest_intact(run / "checkpoints")) == 20
    message = refusal(["fit", *args, "--ckpt_path", "last", "--trainer.max_steps", "12"])  # 12 would resume step 10
    assert "--trainer.max_steps 12 is below the checkpoint's step 20" in message


def test_a_checkpoint_path_that_is_no_regular_file_is_refused_before_the_run_starts(cache_dir, tmp_path):
    """A FIFO hung the run (opening it waits for a writer); each kind on another command."""
    fifo = tmp_path / "pipe.ckpt"
    os.mkfifo(fifo)
    writer = threading.Timer(30, release, [fifo])  # should a reader wait on it again, it fails instead of hanging
    writer.start()
    args = tiny_run_args(tmp_path / "runs", cache_dir, **RUN)
    try:
        for command, path in (("fit", fifo), ("validate", "/dev/zero"), ("test", tmp_path)):
            message = refusal([command, *args, "--ckpt_path", str(path)])
            assert message == f"blindheads {command}: error: not a blindheads checkpoint: {path} (not a regular file)"
    finally:
        writer.cancel()
    assert not (tmp_path / "runs/alibi").exists(), "refused before a run directory was made"


def release(fifo) -> None:
    """Open the FIFO's writing end and close it: a reader waiting on it gets an empty file."""
    with contextlib.suppress(OSError):  # no reader: nothing to release
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_second_fit_from_scratch_into_a_run_folder_is_refused_naming_the_difference(copied, cache_dir, tmp_path):
    """As a new user would: the same fit again with one option changed (and fewer steps), no --ckpt_path. It would
    have rewritten config.yaml, written last-v1.ckpt beside last.ckpt and a second events file, and left
    ``test --ckpt_path last`` on the old model: refused before anything is written, naming the difference."""
    run, _ = copied
    made_with = yaml.safe_load((run / "config.yaml").read_text())["data"]["cache_dir"]  # another xdist worker's
    args = tiny_run_args(tmp_path, made_with, evaluations=True, **RUN)  # the options that made the shared run
    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    message = refusal(["fit", *args, "--model.decoder.position", "alibi(wide)", "--trainer.max_steps", "20"])
    assert message == (
        f"blindheads fit: error: {run} already holds a run with other options (model.decoder.position 'alibi' -> "
        "'alibi(wide)'): a fit without --ckpt_path would mix two runs in one folder; give this run another "
        "--trainer.logger.init_args.version (or remove the folder), or resume the run there with --ckpt_path last"
    ), message
    message = refusal(["fit", *args])  # the same options: it would start over beside its checkpoints
    assert (
        message.startswith(f"blindheads fit: error: {run} already holds a run that saved ") and "last.ckpt" in message
    )
    assert {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before
    assert not (run.parent / "run").joinpath("checkpoints/last-v1.ckpt").exists()
    other = tiny_run_args(tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "wide"})
    main(["fit", *other, "--model.decoder.position", "alibi(wide)", "--trainer.max_steps", "2"])  # another folder
    assert (
        yaml.safe_load((run.parent / "wide/config.yaml").read_text())["model"]["decoder"]["position"] == "alibi(wide)"
    )


@pytest.mark.parametrize(
    ("subcommand", "doing"), [("fit", "resuming from"), ("test", "testing"), ("validate", "validating")]
)
def test_last_names_the_checkpoint_it_found_as_what_the_command_does_with_it(tmp_path, monkeypatch, capsys, subcommand,
                                                                             doing):  # fmt: skip
    from jsonargparse import Namespace

    from blindheads.runs import resume

    ckpt = tmp_path / "alibi" / "run" / "checkpoints" / "last.ckpt"
    monkeypatch.setattr(resume, "newest_intact", lambda folder: ckpt if folder == ckpt.parent else None)
    logger = Namespace(class_path="TensorBoardLogger", init_args=Namespace(save_dir=str(tmp_path), name="alibi",
                                                                           version="run"))  # fmt: skip
    config = Namespace(trainer=Namespace(logger=logger), ckpt_path="last")
    resume.resolve_last(config, subcommand)
    assert config.ckpt_path == str(ckpt) and capsys.readouterr().err == f"{doing} {ckpt}\n"


def test_another_tokenizer_vocabulary_on_resume_is_one_line_naming_the_setting(copied, tmp_path):
    """``--data.builtin_vocab_size 1024`` on a resume of a 4096-token run ended in a 46-line ``size mismatch`` of the
    embedding; another builtin size that pads to the same vocabulary is a change of the data like another tokenizer."""
    run, args = copied
    last = run / "checkpoints/last.ckpt"
    ckpt = ["--ckpt_path", str(last), "--trainer.max_steps", "25"]
    for command, then in (("fit", ", or start a new run without --ckpt_path"), ("validate", "")):
        assert refusal([command, *args, *ckpt[:2], "--data.builtin_vocab_size", "1024"]) == (
            f"blindheads {command}: error: the data changed since the checkpoint: builtin_vocab_size: 4096 -> 1024, a "
            f"vocabulary of 1024 tokens where the checkpoint's model has 4096 ({last}): its weights cannot be loaded; "
            f"give the checkpoint's --data.builtin_vocab_size 4096{then}"
        )
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["datamodule_hyper_parameters"]["builtin_vocab_size"] = 4090  # a run of 4090 tokens, padded to 4096
    torch.save(checkpoint, last)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert refusal(["fit", *args, *ckpt]) == (
        "blindheads fit: error: the data changed since the checkpoint: builtin_vocab_size: 4090 -> 4096. Resuming "
        "would re-read or skip documents; restore the data, or pass --data.accept_data_change true to go on"
    )
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before, "refused before any write"


@pytest.mark.parametrize("size", [0, 10, 10_000, "half"])
def test_an_empty_or_truncated_checkpoint_is_named_so_with_its_size(copied, tmp_path, size):
    """A checkpoint cut short (a full disk, a killed copy) was named ``(OSError)`` or ``(RuntimeError)``, torch's
    error kinds; a 10 000-byte stub is an OSError, half a file a RuntimeError."""
    run, args = copied
    whole = (run / "checkpoints/last.ckpt").read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(whole[: len(whole) // 2 if size == "half" else size])
    message = refusal(["validate", *args, "--ckpt_path", str(cut)])
    assert message == (
        f"blindheads validate: error: not a blindheads checkpoint: {cut} (empty or truncated: {cut.stat().st_size} "
        "bytes)"
    )
