"""Tiny decoders under each attention backend, the position specs they are checked on, and the checks themselves
(shared by the backend, position-family and export tests)."""

import torch

from blindheads.modules import Decoder, DecoderConfig

# With the tiny preset (context 128) and 64-token inputs, clamp(-10) and soft_cap(5) are active, not idle.
BACKEND_SPECS = [
    "nope",
    "rope",
    "rope(500.0)",
    "alibi",
    "alibi(mpt, alibi_bias_max=16)",
    "alibi(steep)",
    "alibi(learnable=True)",
    "alibi+clamp(-10)",
    "alibi+log_distance",
    "alibi+soft_cap(5)",
    "alibi+soft_cap(5, where=before)",
    "alibi+sliding_window(8)",
    "rope+sliding_window(8)",
    "alibi(wide)+clamp+log_distance",
    "alibi(learnable=True)+log_distance+clamp(-3)+soft_cap(8)+sliding_window(24)",
]
COMBINED = BACKEND_SPECS[-1]


def tiny(position, attention, **overrides):
    torch.manual_seed(0)
    return Decoder(DecoderConfig.from_preset("tiny", position=position, attention=attention, **overrides))


def logits_and_grads(model, tokens):
    logits = model(tokens)
    logits.float().pow(2).mean().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def eager_and_sdpa_agree(spec: str) -> dict:
    """The same tiny model under eager and SDPA attention: equal logits and gradients. Returns the eager gradients."""
    tokens = torch.randint(0, 512, (2, 64))
    eager_logits, eager_grads = logits_and_grads(tiny(spec, "eager"), tokens)
    sdpa_logits, sdpa_grads = logits_and_grads(tiny(spec, "sdpa"), tokens)
    torch.testing.assert_close(sdpa_logits, eager_logits, rtol=1e-5, atol=1e-5)
    assert eager_grads.keys() == sdpa_grads.keys()
    for name in eager_grads:
        torch.testing.assert_close(sdpa_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    return eager_grads


def flex_matches_sdpa(spec, length=64):
    torch._dynamo.reset()  # each stack compiles anew; past dynamo's recompile limit it would silently run unfused
    tokens = torch.randint(0, 512, (2, length))
    flex, sdpa = tiny(spec, "flex"), tiny(spec, "sdpa")
    with torch.no_grad():  # compiled FlexAttention has no CPU backward
        flex.requires_grad_(False)
        torch.testing.assert_close(flex(tokens), sdpa(tokens), rtol=1e-4, atol=1e-4)
