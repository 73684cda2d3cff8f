"""Tokens/s and (on GPUs whose peak FLOP/s Lightning knows) MFU, from Lightning's ``ThroughputMonitor``."""

from __future__ import annotations

from lightning.pytorch.callbacks import ThroughputMonitor


def _batch_size(windows) -> int:
    return windows.shape[0]


def _length(windows) -> int:
    return windows.shape[1] - 1  # windows hold seq_len + 1 tokens


class TokenThroughput(ThroughputMonitor):
    """``ThroughputMonitor`` for batches of token windows; MFU uses the module's ``flops_per_batch``."""

    def __init__(self, window_size: int = 50) -> None:
        super().__init__(batch_size_fn=_batch_size, length_fn=_length, window_size=window_size)
