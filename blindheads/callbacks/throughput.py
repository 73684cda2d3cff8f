"""Tokens/s and (on GPUs whose peak FLOP/s Lightning knows) MFU, from Lightning's ``ThroughputMonitor``."""

from __future__ import annotations

from lightning.pytorch.callbacks import ThroughputMonitor


def _batch_size(windows) -> int:
    return windows.shape[0]


def _tokens(windows) -> int:
    """Lightning adds this up per batch and divides by time: it must be the batch's tokens, not one sample's."""
    return windows.shape[0] * (windows.shape[1] - 1)  # windows hold seq_len + 1 tokens, seq_len of them targets


class TokenThroughput(ThroughputMonitor):
    """Tokens a second and MFU, logged as Lightning's ``ThroughputMonitor`` logs them.

    ``ThroughputMonitor`` for batches of token windows (``train/device/items_per_sec`` is tokens/s); MFU uses the
    module's ``flops_per_batch``."""

    def __init__(self, window_size: int = 50) -> None:
        super().__init__(batch_size_fn=_batch_size, length_fn=_tokens, window_size=window_size)
