"""The progress line's step time and ETA: the median step, so an evaluation (one long step) moves neither; the time
it took is named beside them."""

from types import SimpleNamespace

import pytest

from blindheads.callbacks import progress
from blindheads.callbacks.progress import ProgressLines


def test_an_evaluation_moves_neither_the_step_time_nor_the_eta_and_is_named(monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    trainer = SimpleNamespace(global_step=0, max_steps=100, is_global_zero=True, callback_metrics={})
    lines = ProgressLines(every_n_steps=10)
    lines.on_train_start(trainer, None)
    for step in range(1, 21):
        lines.on_train_batch_start(trainer, None, None, step - 1)
        clock[0] += 2.0  # a training step: 2 s
        trainer.global_step = step
        lines.on_train_batch_end(trainer, None, None, None, step - 1)
        if step == 15:
            clock[0] += 60.0  # an evaluation after step 15
    first, second = capsys.readouterr().out.splitlines()
    assert first == "step 10/100  2.00 s/step  eta 3.0 min"
    assert second == "step 20/100  2.00 s/step  eta 2.7 min  + 60 s evaluating"


def test_every_n_steps_below_one_is_refused():
    with pytest.raises(ValueError, match="every_n_steps must be >= 1, got 0"):
        ProgressLines(every_n_steps=0)


def test_lightnings_noise_is_kept_out_but_its_other_warnings_are_not(tmp_path, monkeypatch):
    """A fit on a machine with SLURM installed (a fake ``srun`` on the PATH) prints no srun hint and no tip."""
    import logging
    import warnings

    from lightning.fabric.plugins.environments.slurm import SLURMEnvironment

    from blindheads.cli.lightning import quiet_lightning

    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    with warnings.catch_warnings(record=True) as before:
        warnings.simplefilter("always")
        SLURMEnvironment.detect()  # Lightning's check, as a Trainer runs it
    assert any("srun" in str(w.message) for w in before), "the fake srun must trigger Lightning's hint"
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        quiet_lightning()
        SLURMEnvironment.detect()
        warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)
    tip = logging.LogRecord(logger.name, logging.INFO, "", 0, "💡 Tip: For seamless cloud logging ...", None, None)
    kept = logger.filter(tip)
    logger.filters.clear()
    assert [str(w.message) for w in after] == ["a warning of the user's own"] and not kept


@pytest.mark.parametrize(("command", "prefix"), [("test", "test/"), ("validate", "val/")])
def test_an_evaluation_after_test_or_validate_is_named_with_its_time(monkeypatch, capsys, command, prefix):
    from blindheads.callbacks import periodic
    from blindheads.callbacks.periodic import PeriodicEvaluation

    clock = [0.0]
    monkeypatch.setattr(periodic.time, "monotonic", lambda: clock[0])

    class Slow(PeriodicEvaluation):
        def evaluate(self, trainer, pl_module, prefix=""):
            assert capsys.readouterr().out == f"{command}: Slow ...", "named before it runs"
            self.prefix = prefix
            clock[0] += 95.0

    slow, trainer = Slow(), SimpleNamespace(is_global_zero=True, state=SimpleNamespace(fn=command))
    (slow.on_test_epoch_end if command == "test" else slow.on_validation_epoch_end)(trainer, None)
    assert slow.prefix == prefix and capsys.readouterr().out == " 95 s\n"
