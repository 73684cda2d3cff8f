"""Non-finite steps: found on the device without a per-step sync, skipped there, raised at the next boundary,
and never checkpointed."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from support.callbacks import PoisonGradientAtStep
from support.data import builtin_data
from support.models import cpu_trainer, tiny_lm

from blindheads.checkpoints.reading import read_checkpoint


def fit(cache_dir, tmp_path, callbacks, **decoder):
    data = builtin_data(cache_dir, seq_len=32, batch_size=4, val_windows=4)
    model = tiny_lm(**decoder)
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, save_last=True)
    trainer = cpu_trainer(
        max_steps=12, log_every_n_steps=5, callbacks=[*callbacks, checkpoints], enable_checkpointing=True
    )
    with pytest.raises(FloatingPointError) as error:
        trainer.fit(model, datamodule=data)
    return model, str(error.value)


def test_a_non_finite_gradient_is_skipped_on_the_device_and_reported(cache_dir, tmp_path):
    poison = PoisonGradientAtStep(3)
    model, message = fit(cache_dir, tmp_path, [poison])
    assert "non-finite training loss or gradients at step 3" in message
    # the poisoned step changed no weight (the fused AdamW skipped it), and later steps trained on
    assert torch.isfinite(model.decoder.embed.weight).all()
    written = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert "epoch=0-step=3.ckpt" in written and "epoch=0-step=4.ckpt" not in written, written
    saved = read_checkpoint(tmp_path / "epoch=0-step=3.ckpt")["state_dict"]
    assert all(torch.equal(saved[k], v) for k, v in poison.before.items())


class NonFiniteFromTheStart(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        with torch.no_grad():
            pl_module.decoder.blocks[0].mlp.down_proj.weight.fill_(float("inf"))


class ZeroGradients(L.Callback):
    """A model that learns nothing: every gradient exactly zero (what init_std 1e6 once did, silently)."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        for parameter in pl_module.parameters():
            parameter.grad.zero_()


def test_a_model_that_starts_non_finite_never_checkpoints_nan(cache_dir, tmp_path):
    _, message = fit(cache_dir, tmp_path, [NonFiniteFromTheStart()])
    assert "non-finite" in message
    for path in tmp_path.glob("*.ckpt"):
        state = read_checkpoint(path)["state_dict"]
        assert all(torch.isfinite(t).all() for t in state.values()), path.name


def test_a_run_whose_gradients_are_all_zero_stops_instead_of_training_nothing(cache_dir, tmp_path):
    _, message = fit(cache_dir, tmp_path, [ZeroGradients()])
    assert "every gradient was exactly zero for the last 5 steps (to step 5)" in message
