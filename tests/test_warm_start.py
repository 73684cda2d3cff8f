"""The warm start: a fit begins from another run's decoder weights (its position stack its own, its optimizer,
step and data fresh), each seed from its own run, and a checkpoint of another shape is refused in one line."""

import os

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from support.data import builtin_data
from support.models import cpu_trainer, tiny_lm
from support.runs import refusal, tiny_run_args

from blindheads.callbacks.results import ResultsFile
from blindheads.callbacks.warm_start import WarmStart
from blindheads.checkpoints.reading import load_checkpoint
from blindheads.checkpoints.rebuild import decoder_state
from blindheads.checkpoints.writing import AtomicCheckpointIO


def base_run(tmp_path, cache_dir, position: str = "alibi", seed: int = 3) -> str:
    """A one-step run saved as ``tmp_path/seed{seed}/last.ckpt``, its weights from ``seed``."""
    torch.manual_seed(seed)
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, position=position)
    directory = tmp_path / f"seed{seed}"
    trainer = cpu_trainer(max_steps=1, enable_checkpointing=True,
                          callbacks=[ModelCheckpoint(dirpath=directory, save_last=True)])  # fmt: skip
    trainer.fit(model, datamodule=builtin_data(cache_dir, 64, 2, 2))
    return str(directory / "last.ckpt")


def warm_fit(cache_dir, ckpt_path: str, position: str, seed: int, **trainer):
    """A 0-update fit (the warm start, then one step at lr 0) of a fresh model, returning it and the callback."""
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    torch.manual_seed(100)
    model = tiny_lm({"warmup_steps": 1, "lr": 1e-30, "weight_decay": 0.0}, dtype="float32", context_length=64,
                    position=position)  # fmt: skip
    warm = WarmStart(ckpt_path)
    cpu_trainer(max_steps=1, callbacks=[warm], **trainer).fit(model, datamodule=builtin_data(cache_dir, 64, 2, 2))
    return model, warm


def test_each_seed_starts_from_its_own_runs_weights_and_keeps_its_own_position_stack(tmp_path, cache_dir):
    path = base_run(tmp_path, cache_dir, "alibi", seed=3)
    base = decoder_state(load_checkpoint(path))
    template = str(tmp_path / "seed{seed}" / "last.ckpt")
    model, warm = warm_fit(cache_dir, template, "nope", seed=3)  # an ALiBi run's weights into a NoPE model
    own = model.decoder.state_dict()
    assert not any(k.startswith("position.") for k in own), "NoPE keeps no position state: none was taken"
    for name, tensor in base.items():
        if not name.startswith("position."):
            torch.testing.assert_close(own[name], tensor, rtol=0, atol=1e-6)  # lr 1e-30: the step changes nothing
    assert warm.results_fields["warm_start"]["ckpt_path"] == path
    assert warm.results_fields["warm_start"]["global_step"] == 1 and len(warm.started_from["sha256"]) == 64
    restored = WarmStart(template)
    restored.load_state_dict(warm.state_dict())  # what a resumed fit or a test reads back from the run's checkpoint
    assert restored.results_fields == warm.results_fields


def test_a_checkpoint_of_another_shape_or_a_missing_seed_is_refused_in_one_line(tmp_path, cache_dir):
    torch.manual_seed(0)
    wide = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, hidden_size=128, num_heads=4,
                   num_kv_heads=2)  # fmt: skip
    trainer = cpu_trainer(max_steps=1, enable_checkpointing=True,
                          callbacks=[ModelCheckpoint(dirpath=tmp_path / "seed0", save_last=True)])  # fmt: skip
    trainer.fit(wide, datamodule=builtin_data(cache_dir, 64, 2, 2))
    with pytest.raises(ValueError, match=r"does not fit this model \(shapes differ: embed.weight \(4096, 128\) vs "):
        warm_fit(cache_dir, str(tmp_path / "seed{seed}" / "last.ckpt"), "alibi", seed=0)
    with pytest.raises(FileNotFoundError, match="seed7.last.ckpt does not exist"):
        warm_fit(cache_dir, str(tmp_path / "seed{seed}" / "last.ckpt"), "alibi", seed=7)
    with pytest.raises(ValueError, match="needs ckpt_path"):
        WarmStart()


def test_a_resumed_fit_takes_its_own_checkpoints_weights_not_the_warm_starts(tmp_path, cache_dir):
    path = base_run(tmp_path, cache_dir, "alibi", seed=1)
    os.environ["PL_GLOBAL_SEED"] = "1"
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64)
    run = tmp_path / "run"
    first = cpu_trainer(max_steps=1, enable_checkpointing=True, callbacks=[
        WarmStart(path), ModelCheckpoint(dirpath=run, save_last=True)])  # fmt: skip
    first.fit(model, datamodule=builtin_data(cache_dir, 64, 2, 2))
    saved = decoder_state(load_checkpoint(run / "last.ckpt"))
    again = tiny_lm({"warmup_steps": 1, "lr": 1e-30}, dtype="float32", context_length=64)
    warm = WarmStart(path)
    resumed = cpu_trainer(max_steps=1, callbacks=[warm, ResultsFile()], plugins=[AtomicCheckpointIO()])  # done: no step
    resumed.fit(again, datamodule=builtin_data(cache_dir, 64, 2, 2), ckpt_path=run / "last.ckpt")
    base = decoder_state(load_checkpoint(path))
    assert any((saved[k] != base[k]).any() for k in base), "the run trained a step away from its warm start"
    for name, tensor in saved.items():
        assert torch.equal(again.decoder.state_dict()[name], tensor), name
    assert warm.started_from["ckpt_path"] == path, "its record comes back with the run's checkpoint"


SMALL = {"hidden_size": 32, "num_layers": 1, "mlp_size": 64}  # 2 heads of 16 or 4 of 8: attention weights alike


def small_run(tmp_path, cache_dir, heads: int) -> str:
    """A one-step run of a 1-layer, 32-wide decoder with ``heads`` heads, saved as ``tmp_path/heads{heads}.ckpt``."""
    torch.manual_seed(0)
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, num_heads=heads, num_kv_heads=heads,
                    **SMALL)  # fmt: skip
    trainer = cpu_trainer(max_steps=1)
    trainer.fit(model, datamodule=builtin_data(cache_dir, 64, 2, 2))
    path = tmp_path / f"heads{heads}.ckpt"
    trainer.save_checkpoint(path)
    return str(path)


def small_warm_fit(cache_dir, ckpt_path: str, heads: int):
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, num_heads=heads, num_kv_heads=heads,
                    **SMALL)  # fmt: skip
    cpu_trainer(max_steps=1, callbacks=[WarmStart(ckpt_path)]).fit(model, datamodule=builtin_data(cache_dir, 64, 2, 2))
    return model


def test_nan_weights_or_another_head_layout_are_refused_before_the_first_step(tmp_path, cache_dir):
    """NaN weights trained 10 skipped steps into a traceback, and 2 heads of 16 went silently into 4 heads of 8:
    every tensor has the same shape, so only the checkpoint's config tells them apart."""
    path = small_run(tmp_path, cache_dir, heads=2)
    two, four = (tiny_lm(dtype="float32", context_length=64, num_heads=h, num_kv_heads=h, **SMALL) for h in (2, 4))
    shapes = [{k: v.shape for k, v in m.decoder.state_dict().items() if not k.startswith("position.")}
              for m in (two, four)]  # fmt: skip
    assert shapes[0] == shapes[1], "the weights alone cannot tell the layouts apart"
    with pytest.raises(ValueError) as refused:
        small_warm_fit(cache_dir, path, heads=4)
    assert str(refused.value) == (
        f"callbacks.warm_start: {path} has 2 heads of size 16, 2 key/value heads, this model 4 heads of size 8, 4 "
        "key/value heads: its attention weights would be read as other heads; start from a run of the same heads"
    )
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["state_dict"]["decoder.blocks.0.attn.q_proj.weight"][0, 0] = float("nan")
    checkpoint["state_dict"]["decoder.norm.weight"][3] = float("inf")
    torch.save(checkpoint, tmp_path / "nan.ckpt")
    with pytest.raises(ValueError) as refused:
        small_warm_fit(cache_dir, str(tmp_path / "nan.ckpt"), heads=2)
    assert str(refused.value) == (
        f"callbacks.warm_start: {tmp_path / 'nan.ckpt'} holds nan or inf weights (blocks.0.attn.q_proj.weight, "
        "norm.weight); start from a checkpoint saved before its run diverged"
    )
    model = small_warm_fit(cache_dir, path, heads=2)  # the same layout, finite: taken
    assert torch.isfinite(model.decoder.blocks[0].attn.q_proj.weight).all()


def test_the_seed_in_the_path_is_the_runs_own_never_one_left_in_the_environment(tmp_path, cache_dir, monkeypatch):
    """A run that sets no seed (``--seed_everything false``) took ``{seed}`` from ``PL_GLOBAL_SEED``, which another
    run (a grid's parent, an earlier fit in the process) left behind; a run's config seed wins over it."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")
    template = str(tmp_path / "seed{seed}" / "last.ckpt")
    options = {"--seed_everything": "false", "--callbacks.use": "[warm_start]",
               "--callbacks.warm_start.ckpt_path": template}  # fmt: skip
    said = refusal(["fit", *tiny_run_args(tmp_path, cache_dir, **options)])
    assert said == (
        f"blindheads fit: error: callbacks.warm_start.ckpt_path {template} names {{seed}}, but this run sets no "
        "seed: give --seed_everything N"
    )
    said = refusal(["fit", *tiny_run_args(tmp_path, cache_dir, **{**options, "--seed_everything": "5"})])
    assert said == f"blindheads fit: error: checkpoint {tmp_path / 'seed5' / 'last.ckpt'} does not exist"
