"""A checkpoint is a pickle, and a pickle can name code to run: every command that reads one refuses such a file in
one line, and nothing in it runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
from safetensors import SafetensorError
from support.runs import copy_run, refusal, tiny_run_args
from transformers import BloomConfig, BloomForCausalLM

from blindheads.checkpoints.reading import read_checkpoint
from blindheads.datamodules.cache import MARK
from blindheads.datamodules.tokenizer import builtin_tokenizer_dir, load_tokenizer
from blindheads.disk import no_space
from blindheads.evaluation.lm_eval_adapter import BlindheadsLM, model_arguments
from blindheads.export.directory import export


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


def crafted(trained_run, path, data=None, decoder=None):
    """The shared run's checkpoint with its data settings and decoder config changed as an attacker would (plain
    data only: ``weights_only`` lets it through), saved at ``path``."""
    checkpoint = torch.load(trained_run / "checkpoints/last.ckpt", weights_only=True)
    checkpoint["datamodule_hyper_parameters"].update(data or {})
    checkpoint["hyper_parameters"]["decoder"].update(decoder or {})
    torch.save(checkpoint, path)
    return path


def test_a_checkpoint_names_no_folder_that_is_removed_or_created(trained_run, cache_dir, tmp_path, monkeypatch):
    victim = tmp_path / "victim"  # a folder with a config.json that does not parse as a tokenizer
    victim.mkdir()
    (victim / "config.json").write_text("{")
    (tmp_path / "cache/builtin-tokenizer-1024").mkdir(parents=True)
    vocab = "1024/../../victim"  # cache/builtin-tokenizer-1024/../../victim is tmp_path/victim
    walking = crafted(
        trained_run, tmp_path / "walk.ckpt", {"cache_dir": str(tmp_path / "cache"), "builtin_vocab_size": vocab}
    )
    message = refusal(["export", "--ckpt_path", str(walking), "--out", str(tmp_path / "hf")])
    assert message == (
        "blindheads export: error: the checkpoint's data settings: builtin_vocab_size must be an integer from 257 to "
        f"1048576, got {vocab!r}; give the run's tokenizer (export --tokenizer PATH, lm_eval --model_args "
        "tokenizer=PATH)"
    ), message
    with pytest.raises(ValueError, match="builtin_vocab_size must be an integer"):
        BlindheadsLM.create_from_arg_string(f"ckpt_path={walking}")
    assert (victim / "config.json").read_text() == "{", "a checkpoint removed a folder it named"
    assert not (tmp_path / "hf").exists()

    # a cache_dir pointing anywhere: nothing is made there; the tokenizer comes from the user's cache
    monkeypatch.setenv("BLINDHEADS_CACHE", str(cache_dir))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pointing = crafted(trained_run, tmp_path / "point.ckpt", {"cache_dir": str(elsewhere)})
    export(pointing, tmp_path / "hf")
    assert list(elsewhere.iterdir()) == [], "export created a folder where a checkpoint pointed"
    assert (tmp_path / "hf/tokenizer.json").is_file()


def test_a_cache_folder_the_project_did_not_make_is_never_removed(cache_dir, tmp_path, monkeypatch):
    documents = [(f"doc/{n}", f"document {n:02d} says the river flows past the old mill. " * 20) for n in range(40)]
    monkeypatch.setattr("blindheads.datamodules.tokenizer.builtin_documents", lambda: documents)
    damaged = builtin_tokenizer_dir(tmp_path, 300)
    damaged.mkdir()
    (damaged / "tokenizer_config.json").write_text("{")  # someone's folder, which does not load as a tokenizer
    with pytest.raises(ValueError) as refused:
        load_tokenizer("builtin", tmp_path, 300)
    assert str(refused.value) == (
        f"{damaged} cannot be read (JSONDecodeError), and it was not made by blindheads (no .made-by-blindheads in "
        "it), so it is left alone: move or delete it to rebuild the builtin tokenizer there, or choose another "
        "--data.cache_dir"
    )
    assert (damaged / "tokenizer_config.json").read_text() == "{"
    (damaged / MARK).write_text("")  # the project's own folder, damaged: rebuilt
    assert load_tokenizer("builtin", tmp_path, 300).eos_token == "<|endoftext|>"
    assert (damaged / MARK).is_file() and (damaged / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    "decoder, problem",
    [
        ({"hidden_size": 16384, "num_layers": 64, "mlp_size": 65536},
         "odd.ckpt: its decoder config does not match its weights: embed.weight is (4096, 64), the config makes "
         "(4096, 16384); "),
        ({"num_heads": 8, "num_kv_heads": 4},
         "odd.ckpt: its decoder config does not match its weights: position.components.0.fixed_slopes is (4,), the "
         "config makes (8,)"),
        ({"bogus": 1}, "odd.ckpt: its decoder config has unknown keys bogus; valid: vocab_size, hidden_size, "),
    ],
    ids=["a huge model", "8 heads for 4-head weights", "an unknown key"],
)  # fmt: skip
def test_a_checkpoint_whose_config_does_not_fit_its_weights_is_one_line(
    trained_run, cache_dir, tmp_path, decoder, problem
):
    """Checked before any model is built: the huge one would allocate until memory runs out."""
    ckpt = crafted(trained_run, tmp_path / "odd.ckpt", decoder=decoder)
    message = refusal(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf")])
    assert message.startswith("blindheads export: error: ") and problem in message and "\n" not in message, message
    with pytest.raises(ValueError) as refused:
        BlindheadsLM.create_from_arg_string(f"ckpt_path={ckpt}")
    assert problem in str(refused.value)
    run = tiny_run_args(tmp_path / "runs", cache_dir)
    for command in ("fit", "test"):
        message = refusal([command, *run, "--ckpt_path", str(ckpt)])
        unknown = (
            "its hyperparameters do not fit the model: Subcommand '{}' does not accept option 'model.decoder.bogus'"
        )
        assert (unknown.format(command) if "bogus" in decoder else problem) in message and "\n" not in message, message
    assert not (tmp_path / "runs/alibi").exists()


def test_a_full_disk_under_export_is_one_line_and_leaves_no_model(trained_run, tmp_path):
    staging = tmp_path / f".hf.partial-{os.getpid()}"  # where this process writes the model before renaming it
    staging.mkdir()
    os.symlink("/dev/full", staging / "config.json")  # every write there fails as on a full disk
    message = refusal(
        ["export", "--ckpt_path", str(trained_run / "checkpoints/last.ckpt"), "--out", str(tmp_path / "hf")]
    )
    assert re.fullmatch(
        rf"blindheads export: error: no space left on device writing {tmp_path}/hf \([\d.]+ [KMGT]?B free on "
        rf"{tmp_path}\): free some space, then export again",
        message,
    ), message
    assert not (tmp_path / "hf").exists() and not staging.exists()

    # safetensors writes the weights through a file of its own (no link is followed) and says a full disk in its
    # own error, as on a full 1 MB tmpfs:
    full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert no_space(full) is not None
