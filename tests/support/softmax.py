"""Real softmaxes of a position stack's bias, the reference the calculator is checked against, and the dtype and
threshold cases it is checked in."""

from contextlib import nullcontext

import torch

from blindheads.numerics import flushing_subnormals

# fp16's normal threshold cannot be emulated on a CPU: its subnormals come from conversion, not arithmetic
CASES = [
    ("float64", "normal"),
    ("float64", "subnormal"),
    ("float32", "normal"),
    ("float32", "subnormal"),
    ("bfloat16", "normal"),
    ("bfloat16", "subnormal"),
    ("float16", "subnormal"),
]


def reference_zero_mask(stack, context, dtype, threshold, softmax, scores=None):
    """Per head and key of the last query's row (key positions 0 .. context - 1), whether a real softmax's weight
    is exactly zero."""
    dt = getattr(torch, dtype)
    with torch.no_grad(), flushing_subnormals() if threshold == "normal" else nullcontext():
        logits = stack.dense_bias(1, context, "cpu")[:, 0]
        if scores is not None:
            logits = logits + scores
        if softmax == "materialized":
            weights = torch.softmax(logits.to(dt), dim=-1)
        else:
            wide = logits.to(torch.promote_types(dt, torch.float32))
            weights = torch.exp(wide - wide.max(-1, keepdim=True).values).to(dt)
        return weights == 0
