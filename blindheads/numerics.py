"""The ground floor for numerics: dtypes, the underflow threshold ``tau``, and how this device really rounds.

Everything that needs to know when a softmax weight becomes exactly zero imports from here: the position
components (slope presets, the clamp floor), the blindness calculator above ``modules/`` and the probes.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

Dtype = Literal["float64", "float32", "bfloat16", "float16"]
Threshold = Literal["normal", "subnormal"]
DTYPES = dict(zip(get_args(Dtype), (torch.float64, torch.float32, torch.bfloat16, torch.float16)))
THRESHOLDS = get_args(Threshold)
SOFTMAX_BACKENDS = ("eager", "sdpa")

# The learning horizon: how far (in nats) below its row's largest weight a key's bias may put it before a head stops
# learning to read it, long before the weight is exactly zero (tau, ~87 in float32). The default is the edge
# results/conjecture/verdict.md measured for one head trained with Adam: every seed learned a far-only fact at a bias
# step of 10 nats (starting weight 6e-7), seeds split at 12, none learned from 16 (1.5e-9). Any value can be given.
LEARNING_HORIZON = 12.0


PRECISION_DTYPES = {  # a Lightning trainer precision -> the dtype attention computes in
    "64-true": "float64", "64": "float64", "32-true": "float32", "32": "float32",
    "bf16-mixed": "bfloat16", "bf16-true": "bfloat16", "bf16": "bfloat16",
    "16-mixed": "float16", "16-true": "float16", "16": "float16",
}  # fmt: skip


def check_trainer_precision(requested: str, used: str, dtype: str) -> None:
    """The precision the trainer uses must compute attention in the model's ``dtype`` (its slopes, clamp floor and
    blindness predictions assume it). ``used`` is the trainer's, not the one asked for: Lightning substitutes some
    (``16-mixed`` on a CPU runs as ``bf16-mixed``, with only a log line)."""
    computes = PRECISION_DTYPES.get(used)
    if computes is None or computes == dtype:
        return
    if PRECISION_DTYPES.get(requested) == computes:  # as asked (``32`` is ``32-true``)
        raise ValueError(
            f"--trainer.precision {requested} computes attention in {computes}, but --model.decoder.dtype is {dtype} (its "
            f"slopes, clamp floor and blindness predictions assume it): set --model.decoder.dtype {computes}, or a "
            f"precision that computes in {dtype}"
        )
    raise ValueError(
        f"--trainer.precision {requested} runs as {used} on this accelerator (Lightning substitutes it), which "
        f"computes attention in {computes}, but --model.decoder.dtype is {dtype}: set --trainer.precision {used} and "
        f"--model.decoder.dtype {computes}, or run {requested} where it is supported (a GPU)"
    )


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A supported floating dtype from its name (``"bfloat16"``) or itself."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ValueError(f"unsupported dtype {dtype!r}; valid: {', '.join(DTYPES)}")


def check_threshold(threshold: str) -> str:
    if threshold not in THRESHOLDS:
        raise ValueError(f"unknown threshold mode {threshold!r}; valid: {', '.join(THRESHOLDS)}")
    return threshold


def check_horizon(horizon: float) -> float:
    """A learning horizon in nats: finite and above 0."""
    if not (isinstance(horizon, (int, float)) and math.isfinite(horizon) and horizon > 0):
        raise ValueError(f"the learning horizon must be a finite number of nats above 0, got {horizon!r}")
    return float(horizon)


def apply_threshold(threshold: str) -> None:
    """``normal``: the CPU flushes subnormals, as fused GPU kernels do (and CPU arithmetic on them, which ALiBi's
    softmax is full of, is slow); ``subnormal``: it keeps them. Threads inherit the flag from the one that starts
    them, so it is set before the model or any worker exists."""
    torch.set_flush_denormal(threshold == "normal")


def tau(dtype: str | torch.dtype, threshold: str = "normal") -> float:
    """The logit gap beyond which a softmax weight is exactly zero: ``-ln(smallest weight kept)``.

    ``normal``: the smallest kept weight is the smallest normal number; flush-to-zero kernels (fused GPU attention,
    CPU SDPA in bfloat16) drop everything below it. ``subnormal``: it is half the smallest subnormal number, below
    which round-to-nearest gives zero, as in a kernel that keeps subnormals (most CPU softmaxes). Computed in logs:
    float64's smallest subnormal is itself below what a Python float can hold halved.
    """
    info = torch.finfo(resolve_dtype(dtype))
    if check_threshold(threshold) == "normal":
        return -math.log(info.tiny)
    return -math.log(info.tiny) - math.log(info.eps) + math.log(2)


def round_toward_zero(value: float, dtype: str | torch.dtype) -> float:
    """The representable number of ``dtype`` (and of float32, which the position bias is computed in) nearest to
    ``value`` on the side of zero, so that rounding can never make a negative floor lower."""
    dtype = resolve_dtype(dtype)
    narrow = torch.float32 if dtype == torch.float64 else dtype
    rounded = torch.tensor(value, dtype=torch.float64, device="cpu").to(narrow)  # also under a meta default device
    if abs(rounded.item()) > abs(value):
        rounded = torch.nextafter(rounded, torch.zeros_like(rounded))
    return rounded.item()


def rounding_boundary(value: float | Tensor, dtype: str | torch.dtype) -> Tensor:
    """The number below which a value rounds (to nearest) in ``dtype`` to something strictly below ``value``: the
    midpoint between the largest representable number under ``value`` and the next one up. Float64 results."""
    dtype = resolve_dtype(dtype)
    value = torch.as_tensor(value, dtype=torch.float64, device="cpu")
    below = value.to(dtype)
    below = torch.where(below.double() >= value, torch.nextafter(below, below.new_tensor(-math.inf)), below)
    above = torch.nextafter(below, below.new_tensor(math.inf))
    return (below.double() + above.double()) / 2


@contextmanager
def flushing_subnormals():
    """Make CPU float32/float64 arithmetic flush subnormals to zero, as fused GPU kernels do (``normal`` mode).

    bfloat16 shares float32's exponent range, so its softmax (computed in float32) flushes too; float16 results are
    converted from float32 and keep their subnormals either way. The flag is per thread (and inherited by threads
    started under it), so the block runs single-threaded.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if not torch.set_flush_denormal(True):
        torch.set_num_threads(threads)
        raise RuntimeError("this CPU cannot flush subnormals to zero")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _two_key_weight(gap: float, dtype: torch.dtype, device: torch.device, backend: str) -> float:
    """The weight a softmax gives the key ``gap`` below the other, computed the way ``backend`` computes it."""
    logits = torch.tensor([0.0, -gap], dtype=torch.float64, device=device).to(dtype)
    if backend == "eager":
        return torch.softmax(logits, dim=-1)[1].item()
    if backend == "sdpa":
        # q = k = 0, so the weights are the additive mask's softmax; v = identity returns them.
        q = torch.zeros(1, 1, 1, 8, dtype=dtype, device=device)
        k = torch.zeros(1, 1, 2, 8, dtype=dtype, device=device)
        v = torch.eye(2, 8, dtype=dtype, device=device)[None, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=logits.view(1, 1, 1, 2))[0, 0, 0, 1].item()
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(SOFTMAX_BACKENDS)}")


def measure_tau(
    dtype: str | torch.dtype, device: str | torch.device = "cpu", backend: str = "eager", iterations: int = 60
) -> float:
    """The smallest logit gap at which this device, backend and dtype's softmax returns an exact zero.

    Compare with ``tau(dtype, "normal")`` (flush-to-zero) and ``tau(dtype, "subnormal")`` (subnormals kept). The
    gap is rounded to ``dtype`` before the softmax, so for bfloat16 and float16 it is resolved to their precision.
    """
    dtype, device = resolve_dtype(dtype), torch.device(device)
    sighted, blind = 0.0, 2 * tau(dtype, "subnormal")
    if _two_key_weight(blind, dtype, device, backend) != 0.0:
        raise RuntimeError(f"{backend} softmax in {dtype} on {device} never returned an exact zero")
    for _ in range(iterations):
        middle = (sighted + blind) / 2
        if _two_key_weight(middle, dtype, device, backend) == 0.0:
            blind = middle
        else:
            sighted = middle
    return blind
