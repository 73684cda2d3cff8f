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
