"""When periodic evaluations run: once per optimizer step, with or without gradient accumulation."""

import pytest
from support.data import builtin_data
from support.models import cpu_trainer, tiny_lm

from blindheads.callbacks.periodic import PeriodicEvaluation


class CountingEvaluation(PeriodicEvaluation):
    def __init__(self, every_n_steps: int) -> None:
        super().__init__(every_n_steps)
        self.steps: list[int] = []

    def evaluate(self, trainer, pl_module, prefix: str = "") -> None:
        self.steps.append(trainer.global_step)


@pytest.mark.parametrize("accumulate", [1, 3])
def test_evaluations_run_once_per_optimizer_step(cache_dir, accumulate):
    """With accumulation, three batches end at each global step: the evaluation must still run once."""
    data = builtin_data(cache_dir, seq_len=16, batch_size=2, val_windows=2)
    model = tiny_lm({"warmup_steps": 1})
    counting = CountingEvaluation(every_n_steps=2)
    trainer = cpu_trainer(max_steps=6, accumulate_grad_batches=accumulate, callbacks=[counting])
    trainer.fit(model, datamodule=data)
    assert counting.steps == [2, 4, 6]


@pytest.mark.slow
def test_importing_the_package_leaves_the_matplotlib_backend_alone():
    import subprocess
    import sys

    code = (
        "import matplotlib\nmatplotlib.use('svg')\nimport blindheads.callbacks.underflow, blindheads.cli.probe\n"
        "print(matplotlib.get_backend())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "svg", result.stderr[-2000:]
