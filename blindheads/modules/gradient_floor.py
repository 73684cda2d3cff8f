"""A softmax whose forward pass is the plain one and whose backward pass sees every key at least ``e^-H`` of its
row's largest weight: the gradient-only arm of the learning-horizon experiment.

The softmax's backward is ``dL/dx_j = P_j (g_j - sum_k P_k g_k)`` with ``g = dL/dP``. A key whose weight ``P_j`` is
tiny (or exactly 0) passes almost no gradient to its logit, however much reading it would lower the loss. Here the
backward uses ``P~ = max(P, e^-H * max_k P_k)`` in that formula instead, over the keys the mask lets a query see
(masked keys keep exactly 0), so such keys get the gradient of a weight at the horizon, while the forward pass (the
loss, every activation) is bit-identical to ``torch.softmax``. It changes what a head can learn, and nothing it
computes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from blindheads.numerics import check_horizon


class _FlooredGradientSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, horizon: float) -> Tensor:
        weights = torch.softmax(logits, dim=-1)
        ctx.save_for_backward(weights, logits > -math.inf)
        ctx.floor = math.exp(-horizon)
        return weights

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        weights, visible = ctx.saved_tensors
        floored = torch.where(visible, torch.maximum(weights, weights.amax(-1, keepdim=True) * ctx.floor), 0.0)
        return floored * (grad - (floored * grad).sum(-1, keepdim=True)), None


def floored_gradient_softmax(logits: Tensor, horizon: float) -> Tensor:
    """``torch.softmax(logits, -1)``, with the backward of a softmax whose visible weights are at least
    ``e^-horizon`` of their row's largest (``horizon`` in nats)."""
    return _FlooredGradientSoftmax.apply(logits, check_horizon(horizon))
