"""A training batch that cannot fit in memory is refused before the first step, naming the batch size and the most
that could fit.

Past the machine's memory a CPU run is killed by the kernel without a word, and a GPU run ends in a long
out-of-memory traceback. The loss alone needs the float32 logits and their log-softmax, 8 bytes per position and
vocabulary entry of a batch: ``batch_size * seq_len * vocab_size * 8`` bytes is a floor (activations come on top),
so a batch under it may still not fit, but one over it never does.
"""

from __future__ import annotations

import torch

BYTES_PER_LOGIT = 8  # a float32 logit and its float32 log-softmax


def free_bytes(device: torch.device) -> int | None:
    """Memory new tensors can take on ``device`` (on CPU the machine's available memory: a container's or a job's
    own limit may be lower); ``None`` where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def check_batch_fits(batch_size: int, seq_len: int, vocab_size: int, device: torch.device) -> None:
    """Raise ``ValueError`` when a batch's logits alone exceed the free memory of ``device``."""
    free = free_bytes(device)
    per_window = BYTES_PER_LOGIT * seq_len * vocab_size
    if free is None or batch_size * per_window <= free:
        return
    raise ValueError(
        f"--data.batch_size {batch_size} cannot fit: the loss alone needs {batch_size * per_window / 2**30:.1f} GiB "
        f"({batch_size} windows x {seq_len} positions x {vocab_size} vocabulary entries x {BYTES_PER_LOGIT} bytes) "
        f"and {device.type} has {free / 2**30:.1f} GiB free: at most {free // per_window} windows could fit, fewer "
        "with the model's activations"
    )
