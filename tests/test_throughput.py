"""TokenThroughput's tokens/s against tokens counted and time measured independently."""

import time

import lightning as L
import pytest
from lightning.pytorch.loggers.logger import Logger
from support.data import builtin_data
from support.models import cpu_trainer, tiny_lm

from blindheads.callbacks.throughput import TokenThroughput


class Recorder(Logger):
    """Keeps every logged metric in memory."""

    def __init__(self):
        super().__init__()
        self.metrics: dict[str, dict[int, float]] = {}

    name, version = "recorder", 0

    def log_metrics(self, metrics, step=None):
        for key, value in metrics.items():
            self.metrics.setdefault(key, {})[step] = value

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class Clock(L.Callback):
    """Tokens and wall time per batch, measured here."""

    def __init__(self):
        self.tokens, self.times = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.tokens.append(batch[:, 1:].numel())
        self.times.append(time.perf_counter())


def test_tokens_per_second_counts_every_token_of_the_batch(cache_dir):
    data = builtin_data(cache_dir, seq_len=64, batch_size=8, val_windows=8)
    model = tiny_lm()
    recorder, clock = Recorder(), Clock()
    trainer = cpu_trainer(
        max_steps=12, logger=recorder, log_every_n_steps=1, callbacks=[TokenThroughput(window_size=4), clock]
    )
    trainer.fit(model, datamodule=data)
    lengths = recorder.metrics["train/lengths"]
    last = max(lengths)
    assert lengths[last] == sum(clock.tokens) == 12 * 8 * 64
    logged = recorder.metrics["train/device/items_per_sec"][last]
    measured = sum(clock.tokens[-3:]) / (clock.times[-1] - clock.times[-4])  # the same 4-batch window
    assert logged == pytest.approx(measured, rel=0.25)
    samples = recorder.metrics["train/device/samples_per_sec"][last]
    assert logged == pytest.approx(samples * 64)
