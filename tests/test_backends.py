"""The three attention backends agree on outputs and gradients for every position component and combination."""

import pytest
import torch
from support.backends import BACKEND_SPECS, COMBINED, eager_and_sdpa_agree, flex_matches_sdpa, logits_and_grads, tiny

from blindheads.modules import DecoderConfig, backends
from blindheads.modules.backends import (
    BlockedEager,
    Eager,
    Flex,
    Sdpa,
    flex_block_mask,
    resolve_backend,
    select_backend,
)


@pytest.mark.parametrize("spec", BACKEND_SPECS)
def test_eager_and_sdpa_agree_on_outputs_and_gradients(spec):
    eager_and_sdpa_agree(spec)


def test_learnable_slopes_get_gradients():
    _, grads = logits_and_grads(tiny("alibi(learnable=True)", "sdpa"), torch.randint(0, 512, (2, 64)))
    assert grads["position.components.0.log_slopes"].abs().min() > 0


def test_bfloat16_backends_agree_within_bfloat16_tolerance():
    tokens = torch.randint(0, 512, (2, 64))
    eager, sdpa = tiny(COMBINED, "eager").bfloat16(), tiny(COMBINED, "sdpa").bfloat16()
    torch.testing.assert_close(sdpa(tokens).float(), eager(tokens).float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("spec", BACKEND_SPECS)
def test_compiled_flex_matches_sdpa(spec):
    flex_matches_sdpa(spec)


def test_flex_skips_blocks_outside_the_sliding_window():
    stack = tiny("alibi+sliding_window(64)", "sdpa").position
    causal = flex_block_mask(tiny("alibi", "sdpa").position, 1024, torch.device("cpu"))
    windowed = flex_block_mask(stack, 1024, torch.device("cpu"))
    assert windowed.sparsity() > causal.sparsity() + 30  # percent of blocks never computed


def test_auto_picks_flex_on_cuda_and_sdpa_elsewhere():
    assert resolve_backend("auto", torch.device("cuda")) == "flex"
    assert resolve_backend("auto", torch.device("cpu")) == "sdpa"
    with pytest.raises(ValueError, match="valid: auto, flex, sdpa, eager"):
        DecoderConfig.from_preset("tiny", attention="fused")


def test_sdpa_in_query_chunks_equals_the_whole_bias(monkeypatch):
    """Long evaluations attend in query chunks so the bias never holds length x length rows at once."""
    tokens = torch.randint(0, 512, (1, 96))
    model = tiny("alibi+clamp(-10)+sliding_window(40)", "sdpa")
    whole = model(tokens)
    monkeypatch.setattr(backends, "SDPA_BIAS_BUDGET", 4 * 96 * 7)  # 7 query rows per chunk
    bias = backends.SdpaBias(model.position, 96, torch.device("cpu"))
    assert bias.whole is None and bias.block == 7
    torch.testing.assert_close(model(tokens), whole, rtol=1e-5, atol=1e-5)


def test_a_backend_can_be_forced_per_call():
    model = tiny("alibi+soft_cap(5)", "sdpa")
    tokens = torch.randint(0, 512, (1, 32))
    torch.testing.assert_close(model(tokens, attention="eager"), model(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("budget", [2**27, 4 * 64 * 20])  # the bias built once and sliced, or block by block
@pytest.mark.parametrize("spec", ["alibi", "alibi+sliding_window(8)", "rope+sliding_window(8)", COMBINED])
def test_sdpa_in_causal_query_blocks_equals_eager(spec, budget, monkeypatch):
    monkeypatch.setattr(backends, "SDPA_QUERY_BLOCK", 16)
    monkeypatch.setattr(backends, "SDPA_BIAS_BUDGET", budget)
    tokens = torch.randint(0, 512, (2, 64))
    eager_logits, eager_grads = logits_and_grads(tiny(spec, "eager"), tokens)
    sdpa_logits, sdpa_grads = logits_and_grads(tiny(spec, "sdpa"), tokens)
    torch.testing.assert_close(sdpa_logits, eager_logits, rtol=1e-5, atol=1e-5)
    for name in eager_grads:
        torch.testing.assert_close(sdpa_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_query_blocks_skip_the_masked_keys():
    stack = tiny("alibi", "sdpa").position
    whole = sum((stop - start) * (stop - first) for start, stop, first in backends.SdpaBias(stack, 1024, "cpu"))
    assert whole == sum(128 * stop for stop in range(128, 1025, 128))  # 56% of the square, not all of it
    windowed = tiny("alibi+sliding_window(100)", "sdpa").position
    blocks = list(backends.SdpaBias(windowed, 1024, "cpu"))
    assert blocks[2] == (256, 384, 157) and blocks[-1] == (896, 1024, 797)  # keys the window hides are skipped


def test_one_place_decides_the_kernel():
    stack = tiny("alibi+soft_cap(5)", "sdpa").position
    assert select_backend("sdpa", stack, torch.device("cpu")) is BlockedEager  # soft caps are not a mask
    assert select_backend("auto", stack, torch.device("cpu")) is BlockedEager
    assert select_backend("eager", stack, torch.device("cpu")) is Eager
    additive = tiny("alibi", "sdpa").position
    assert select_backend("auto", additive, torch.device("cuda")) is Flex
    assert select_backend("auto", additive, torch.device("cpu")) is Sdpa


def test_what_does_not_change_between_steps_is_built_once():
    model, tokens = tiny("rope+alibi+sliding_window(24)", "sdpa"), torch.randint(0, 512, (1, 64))
    model(tokens)
    backend = model.backend_for(torch.device("cpu"))
    bias, cos = backend.prepared, model.position.components[0].cos
    first = model(tokens)
    assert backend.prepared is bias and model.position.components[0].cos is cos
    flex = model.backend_for(torch.device("cpu"), "flex")
    flex.prepare(model.position, 64, torch.device("cpu"), torch.float32)
    mask = flex.prepared
    flex.prepare(model.position, 64, torch.device("cpu"), torch.float32)
    assert flex.prepared is mask
    model(torch.randint(0, 512, (1, 32)))
    assert backend.prepared is not bias and backend.prepared.length == 32  # another length: built again
    # new slopes loaded into the fixed buffer invalidate the cache, and the output follows them
    state = model.state_dict()
    state["position.components.1.fixed_slopes"] = state["position.components.1.fixed_slopes"] * 2
    model.load_state_dict(state)
    model(tokens)
    reference = tiny("rope+alibi+sliding_window(24)", "eager")
    reference.load_state_dict(state)
    torch.testing.assert_close(model(tokens), reference(tokens), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(model(tokens), first)


def test_learnable_slopes_rebuild_their_bias_every_forward():
    model, tokens = tiny("alibi(learnable=True)", "sdpa"), torch.randint(0, 512, (1, 64))
    model(tokens)
    backend = model.backend_for(torch.device("cpu"))
    bias = backend.prepared
    model(tokens)
    assert backend.prepared is not bias
