"""The gradient-only floor: the forward pass of ``torch.softmax``, the backward pass of a softmax whose visible
weights are at least e^-H of their row's largest. Checked against the softmax Jacobian written out by hand and
against autograd through ``torch.softmax``."""

import math

import pytest
import torch
from support.backends import logits_and_grads, tiny

from blindheads.modules import DecoderConfig
from blindheads.modules.gradient_floor import floored_gradient_softmax


def causal_logits(length: int = 24, slope: float = 6.0, heads: int = 2) -> torch.Tensor:
    """Random q.k plus a steep ALiBi bias, causal mask: far keys far below the horizon, some exactly 0 in float32."""
    torch.manual_seed(0)
    d = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).float()
    bias = -slope * torch.arange(1, heads + 1)[:, None, None] * d.clamp_min(0)
    logits = torch.randn(3, heads, length, length) + bias
    return logits.masked_fill(d < 0, -math.inf).requires_grad_()


def jacobian_by_hand(weights: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``(diag(p) - p p^T) g`` per row, built as matrices."""
    jacobian = torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]
    return (jacobian @ grad[..., None])[..., 0]


def test_the_forward_pass_is_torch_softmax_bit_for_bit():
    logits = causal_logits()
    assert torch.equal(floored_gradient_softmax(logits, 12.0), torch.softmax(logits, dim=-1))


def test_the_backward_pass_is_the_jacobian_of_the_floored_weights_and_masked_keys_get_none():
    logits, horizon = causal_logits(), 12.0
    grad = torch.randn(logits.shape)
    floored_gradient_softmax(logits, horizon).backward(grad)
    weights = torch.softmax(logits.detach(), dim=-1)
    visible = torch.isfinite(logits.detach())
    floor = weights.amax(-1, keepdim=True) * math.exp(-horizon)  # the spec: max(P, e^-H max P) where visible
    floored = torch.where(visible, torch.maximum(weights, floor), 0.0)
    assert (floored[visible] > 0).all() and (weights == 0).any()  # the case: exact zeros, all lifted
    by_hand = jacobian_by_hand(floored.double(), grad.double())  # in float64: float32's rounding is all that differs
    torch.testing.assert_close(logits.grad.double(), by_hand, rtol=0, atol=1e-6)
    assert (logits.grad[~visible] == 0).all()


def test_rows_with_no_key_below_the_floor_get_the_plain_gradient_and_others_differ_only_through_those_keys():
    logits, horizon = causal_logits(), 12.0
    grad = torch.randn(logits.shape)
    floored_gradient_softmax(logits, horizon).backward(grad)
    ours = logits.grad.clone()
    logits.grad = None
    torch.softmax(logits, dim=-1).backward(grad)
    weights = torch.softmax(logits.detach(), dim=-1)
    below = torch.isfinite(logits.detach()) & (weights < weights.amax(-1, keepdim=True) * math.exp(-horizon))
    untouched = ~below.any(-1)  # rows (the first few queries) whose every visible key is within the horizon
    assert untouched.any() and (~untouched).any()
    torch.testing.assert_close(ours[untouched], logits.grad[untouched], rtol=0, atol=1e-6)
    zero = below & (weights == 0)  # exactly 0: the plain softmax passes them nothing, the floored one does
    assert zero.any() and (logits.grad[zero] == 0).all() and (ours[zero] != 0).all()


def test_a_horizon_beyond_every_weight_gives_the_gradient_of_torch_softmax():
    logits = causal_logits(slope=0.1)
    grad = torch.randn(logits.shape)
    floored_gradient_softmax(logits, 80.0).backward(grad)  # e^-80: below every weight of these rows
    ours = logits.grad.clone()
    logits.grad = None
    torch.softmax(logits, dim=-1).backward(grad)
    torch.testing.assert_close(ours, logits.grad, rtol=0, atol=1e-6)  # float32 rounding order only


def test_a_decoder_with_the_floor_computes_the_same_logits_and_loss_and_other_gradients_through_far_keys():
    tokens = torch.randint(0, 512, (2, 64))
    plain_logits, plain_grads = logits_and_grads(tiny("alibi(steep)", "eager"), tokens)
    floored_logits, floored_grads = logits_and_grads(tiny("alibi(steep)", "eager", gradient_floor=12.0), tokens)
    assert torch.equal(plain_logits, floored_logits)
    assert not torch.equal(plain_grads["blocks.0.attn.q_proj.weight"], floored_grads["blocks.0.attn.q_proj.weight"])
    # without keys below the floor (NoPE: weights stay within e^-12 of the row's largest), the same gradients
    nope_plain = logits_and_grads(tiny("nope", "eager"), tokens)[1]
    nope_floored = logits_and_grads(tiny("nope", "eager", gradient_floor=12.0), tokens)[1]
    for name, value in nope_plain.items():
        torch.testing.assert_close(value, nope_floored[name], rtol=1e-5, atol=1e-8)  # rounding order only


@pytest.mark.parametrize("value", [0.0, -3.0, math.nan, math.inf])
def test_a_gradient_floor_that_is_not_a_finite_positive_horizon_is_refused(value):
    with pytest.raises(ValueError, match=r"learning horizon must be a finite number of nats above 0"):
        DecoderConfig.from_preset("tiny", attention="eager", gradient_floor=value)


def test_a_gradient_floor_outside_the_eager_backend_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"gradient_floor 12.0 needs attention eager.*got attention sdpa"):
        DecoderConfig.from_preset("tiny", attention="sdpa", gradient_floor=12.0)
