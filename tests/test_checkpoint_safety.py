"""A checkpoint is a pickle, and a pickle can name code to run: every command that reads one refuses such a file in
one line, and nothing in it runs."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from training_runs import copy_run, refusal, tiny_run_args
from transformers import BloomConfig, BloomForCausalLM

from blindheads.checkpoints import read_checkpoint
from blindheads.evaluation.lm_eval_adapter import BlindheadsLM, model_arguments


class RunsAShellCommand:
    """What an attacker puts in a checkpoint: unpickling it runs ``touch MARKER``."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def poisoned(trained_run, tmp_path):
    """A real checkpoint of the shared run with one more entry that runs a command when unpickled (zip format), the
    same in torch's legacy (non-zip) format, and the marker file either would create."""
    marker = tmp_path / "code-ran"
    checkpoint = torch.load(trained_run / "checkpoints/last.ckpt", weights_only=True)
    checkpoint["callbacks"]["payload"] = RunsAShellCommand(marker)
    torch.save(checkpoint, tmp_path / "poisoned.ckpt")
    torch.save(checkpoint, tmp_path / "legacy.ckpt", _use_new_zipfile_serialization=False)
    return tmp_path / "poisoned.ckpt", tmp_path / "legacy.ckpt", marker


def test_every_command_that_reads_a_checkpoint_refuses_one_that_runs_code(poisoned, trained_run, cache_dir, tmp_path):
    zipped, legacy, marker = poisoned
    copy_run(trained_run, tmp_path / "runs")
    run = tiny_run_args(tmp_path / "runs", cache_dir, **{"--trainer.logger.init_args.version": "run"})
    for ckpt in (zipped, legacy):
        for command in ("fit", "validate", "test"):
            message = refusal([command, *run, "--ckpt_path", str(ckpt)])
            assert f"not a blindheads checkpoint: {ckpt}" in message and "\n" not in message, message
        message = refusal(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf")])
        assert message == (
            f"blindheads export: error: not a blindheads checkpoint: {ckpt} (it asks to run posix.system; only "
            "tensors, plain data and blindheads configs are unpickled, so it was refused and nothing in it ran)"
        ), message
        with pytest.raises(ValueError, match="not a blindheads checkpoint"):
            BlindheadsLM.create_from_arg_string(f"ckpt_path={ckpt}")
        with pytest.raises(ValueError, match="not a blindheads checkpoint"):
            read_checkpoint(ckpt)
    assert not (tmp_path / "hf").exists()
    assert not marker.exists(), "a command in a checkpoint ran"


def test_a_published_model_directory_whose_weights_run_code_is_refused(tmp_path):
    marker = tmp_path / "code-ran"
    model_dir = tmp_path / "bloom"
    BloomForCausalLM(BloomConfig(vocab_size=256, hidden_size=32, n_head=2, n_layer=1)).save_pretrained(model_dir)
    (model_dir / "model.safetensors").unlink()
    torch.save({"payload": RunsAShellCommand(marker)}, model_dir / "pytorch_model.bin")
    message = refusal(["probe", "--model", str(model_dir), "--lengths", "64", "--out", str(tmp_path / "p")])
    assert message.startswith("blindheads probe: error: ") and "\n" not in message, message
    assert not marker.exists(), "a command in a model's weights ran"


def test_a_checkpoint_path_that_is_no_regular_file_is_refused_before_it_is_read(tmp_path):
    fifo = tmp_path / "pipe.ckpt"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(ValueError, match=r"pipe.ckpt \(not a regular file\)"):
        read_checkpoint(fifo)
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*missing.ckpt does not exist"):
        read_checkpoint(tmp_path / "missing.ckpt")


def test_lm_eval_model_args_keep_commas_in_a_checkpoint_path(trained_run, tmp_path):
    odd = tmp_path / "a,b" / "last.ckpt"
    odd.parent.mkdir()
    shutil.copy(trained_run / "checkpoints/last.ckpt", odd)
    assert model_arguments(f"ckpt_path={odd},batch_size=2") == {"ckpt_path": str(odd), "batch_size": "2"}
    model = BlindheadsLM.create_from_arg_string(f"ckpt_path={odd},batch_size=2")
    assert model.batch_size == 2
    with pytest.raises(ValueError, match=r"unknown argument 'pretrained'; valid: ckpt_path, "):
        BlindheadsLM.create_from_arg_string(f"pretrained={odd}")


def test_an_export_killed_part_way_leaves_no_model_directory_and_the_next_one_clears_its_debris(trained_run, tmp_path):
    from blindheads.export.directory import export

    dead = subprocess.Popen(["true"])
    dead.wait()  # a process ID that is no longer alive, as a killed export's
    debris = tmp_path / f".hf.partial-{dead.pid}"
    debris.mkdir()
    (debris / "config.json").write_text("{")  # what a kill -9 mid-export leaves: half a model, beside the target
    assert not (tmp_path / "hf").exists(), "a half export is never at the target"
    export(trained_run / "checkpoints/last.ckpt", tmp_path / "hf")
    assert not debris.exists()
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "hf").iterdir()}
    assert not list(tmp_path.glob(".hf.partial-*")), "the export's own staging folder was renamed into place"
