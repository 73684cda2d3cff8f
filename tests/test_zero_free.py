"""The zero-free arm and the floor: the model in float64 keeps every weight float32 zeroes (checked against
torch.softmax by hand) and computes what float32 computes elsewhere; a gradient reaches a far key that float32 blinds
(autograd against the softmax's own derivative); a floor holds every bias at or above it, as a trained clamp does;
EpisodeRecall reports both."""

import math

import pytest
import torch
from support.data import builtin_data
from support.models import cpu_trainer, tiny_lm

from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.datamodules.retrieval_mix import RetrievalMix
from blindheads.evaluation.attribution import floored_bias, in_float64
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder
from blindheads.numerics import flushing_subnormals

STEEP = "alibi([4.0])"  # one head, slope 4: float32 (flushed) zeroes a key 22 tokens back, float64 one 178 back


def decoder(position: str = STEEP, attention: str = "sdpa", **fields) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig.from_preset("tiny", vocab_size=64, attention=attention, dtype="float32", position=position,
                                       num_heads=1, num_kv_heads=1, **fields)  # fmt: skip
    return Decoder(config).eval()


def eager_weights(model: Decoder, tokens: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every layer's eager weights (batch, heads, queries, keys) with the softmax in ``dtype`` (as the monitors
    measure), kept in the dtype computed."""
    seen = []
    handles = [b.attn.weights.register_forward_hook(lambda m, i, o: seen.append(o)) for b in model.blocks]
    try:
        model.hidden_states(tokens, attention="eager", softmax_dtype=dtype)
    finally:
        for handle in handles:
            handle.remove()
    return seen


@torch.no_grad()
def test_in_float64_every_weight_float32_zeroes_is_kept_and_matches_torch_softmax_by_hand():
    model, tokens = decoder(), torch.randint(0, 64, (2, 60))
    wide = in_float64(model)
    with flushing_subnormals():
        float32 = eager_weights(model, tokens, torch.float32)
        float64 = eager_weights(wide, tokens, torch.float64)
    assert all((w[:, :, -1, :20] == 0).all() for w in float32), "slope 4, 40+ tokens back: 160+ nats, zero in float32"
    assert all(w.dtype == torch.float64 and (w[:, :, -1] > 0).all() for w in float64)
    attn, x = wide.blocks[0].attn, wide.blocks[0].attn_norm(wide.embed(tokens))  # the first layer, by hand
    q, k = (proj(x).view(2, 60, 1, -1).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj))
    distance = torch.arange(60)[:, None] - torch.arange(60)[None, :]
    bias = torch.where(distance >= 0, -4.0 * distance, -math.inf).double()
    reference = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias, dim=-1)
    torch.testing.assert_close(float64[0], reference, rtol=1e-12, atol=0)
    with flushing_subnormals():  # weights of 1e-70 change no output: both compute the same logits
        torch.testing.assert_close(wide(tokens).float(), model(tokens), rtol=1e-4, atol=1e-4)
    assert next(model.parameters()).dtype == torch.float32, "the copy is the model's, the model stays as it was"


@torch.no_grad()
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_in_float64_every_backend_of_the_copy_computes_in_float64_by_default(attention):
    """The copy scored as it is (its own backend, no softmax dtype asked for) keeps the weights float32 zeroes: the
    eager softmax's dtype is a setting that ``.double()`` alone would leave at float32."""
    model, tokens = decoder(attention=attention), torch.randint(0, 64, (2, 60))
    wide = in_float64(model)
    seen = []
    handles = [b.attn.weights.register_forward_hook(lambda m, i, o: seen.append(o)) for b in wide.blocks]
    with flushing_subnormals():
        logits = wide(tokens)
        for handle in handles:
            handle.remove()
        if attention == "eager":
            assert seen and all(w.dtype == torch.float64 and (w[:, :, -1] > 0).all() for w in seen)
        by_hand = wide(tokens, attention="eager")  # eager against the copy's own backend, both in float64
    assert logits.dtype == torch.float64 and wide.config.softmax_dtype == "float64"
    torch.testing.assert_close(logits, by_hand, rtol=1e-10, atol=1e-10)


def test_in_float64_a_gradient_reaches_a_far_key_and_in_float32_none_does():
    """d(sum of the last query's output) / d(input at key 0) through one attention layer is ``p0 Wv^T u + s0 Wk^T q /
    sqrt(D)``, with ``u = Wo^T 1``, ``z = sum_j pj vj`` and ``s0 = p0 (v0 - z) . u``: every term carries the weight
    p0 key 0 gets, 236 nats down. Exactly 0 in flushed float32; in float64 autograd through SDPA equals that formula."""

    def key_gradient(model: Decoder) -> tuple[torch.Tensor, torch.Tensor]:
        x = model.embed(torch.arange(60)[None] % 64).detach().requires_grad_()
        backend = model.backend_for(x.device)
        backend.prepare(model.position, 60, x.device, x.dtype)
        model.position.prepare(60, model.config.head_size, x.device)
        y = model.blocks[0].attn(x, model.position, backend)
        y[0, -1].sum().backward()
        return x.detach()[0], x.grad[0, 0]

    with flushing_subnormals():
        model = decoder()
        _, blinded = key_gradient(model)
        wide = in_float64(model)
        x, kept = key_gradient(wide)
    assert torch.equal(blinded, torch.zeros_like(blinded)), "exactly 0 in float32: no gradient through the zero"
    attn = wide.blocks[0].attn
    with torch.no_grad():
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        size = math.sqrt(q.shape[-1])
        p = torch.softmax(q[-1] @ k.T / size - 4.0 * torch.arange(59, -1, -1.0, dtype=torch.float64), 0)
        u = attn.o_proj.weight.T @ torch.ones(attn.o_proj.weight.shape[0], dtype=torch.float64)
        s0 = p[0] * (v[0] - p @ v) @ u
        reference = p[0] * attn.v_proj.weight.T @ u + s0 * attn.k_proj.weight.T @ q[-1] / size
    assert 0 < p[0] < 1e-100 and kept.abs().max() > 0
    torch.testing.assert_close(kept, reference, rtol=1e-6, atol=0)


@torch.no_grad()
def test_under_a_floor_every_bias_is_at_least_the_floor_and_the_model_computes_as_a_trained_clamp():
    plain, clamped = decoder("alibi([0.5])"), decoder("alibi([0.5])+clamp(floor=-6.0)")
    clamped.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 64, (2, 40))
    before = plain(tokens)
    with floored_bias(plain, -6.0):
        bias = plain.position.dense_bias(1, 40, torch.device("cpu"))[0, 0]
        floored = plain(tokens)
    assert torch.equal(bias, (-0.5 * torch.arange(39, -1, -1.0)).clamp_min(-6.0))
    torch.testing.assert_close(floored, clamped(tokens))
    assert (floored - before).abs().max() > 1e-3
    torch.testing.assert_close(plain(tokens), before)


def test_episode_recall_reports_recall_and_zeros_with_float64_attention_and_under_a_floor(cache_dir):
    data = builtin_data(cache_dir, 64, 2, 2, retrieval_mix=RetrievalMix(facts=1, value_digits=(1, 1), max_gap=16))
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, position="alibi([2.0, 1.0, 1.0, 1.0])")
    recall = EpisodeRecall(every_n_steps=None, gaps=[], distances=[0.5, 4.0], samples=4, batch_size=4,
                           zero_free=True, floor=-8.0)  # fmt: skip
    trainer = cpu_trainer(max_steps=1, callbacks=[recall])
    trainer.fit(model, datamodule=data)
    with flushing_subnormals(), torch.inference_mode():  # as blindheads test runs it
        scalars = recall.evaluate(trainer, model)
    far = "recall/distance4x"
    # 256 tokens back at slopes 2 and 1: 256 to 512 nats down, past float32's 87 and short of float64's 708
    assert scalars[f"{far}/zeros"] == 1.0 and scalars[f"{far}/zeros_zero_free"] == 0.0
    assert scalars["recall/distance0.5x/zeros"] == 0.0, "32 tokens back: 64 nats at most, kept by float32"
    for point in ("distance0.5x", "distance4x"):
        for part in ("exact", "exact_zero_free", "exact_floored"):
            assert 0 <= scalars[f"recall/{point}/{part}"] <= 1


def test_a_floor_that_is_not_a_finite_negative_bias_is_refused():
    for floor in (0.0, 3.0, -math.inf, math.nan):
        with pytest.raises(ValueError, match="floor must be a finite negative bias"):
            EpisodeRecall(distances=[1.0], floor=floor)


def test_a_model_trained_in_float64_is_its_own_zero_free_copy(cache_dir):
    data = builtin_data(cache_dir, 64, 2, 2, retrieval_mix=RetrievalMix(facts=1, value_digits=(1, 1), max_gap=16))
    model = tiny_lm({"warmup_steps": 1}, dtype="float64", context_length=64, position="alibi([2.0, 1.0, 1.0, 1.0])")
    recall = EpisodeRecall(every_n_steps=None, gaps=[], distances=[4.0], samples=4, batch_size=4, zero_free=True)
    trainer = cpu_trainer(max_steps=1, callbacks=[recall], precision="64-true")
    trainer.fit(model, datamodule=data)
    assert next(model.parameters()).dtype == torch.float64
    with flushing_subnormals(), torch.inference_mode():
        scalars = recall.evaluate(trainer, model)
    assert scalars["recall/distance4x/zeros"] == scalars["recall/distance4x/zeros_zero_free"] == 0.0
    assert scalars["recall/distance4x/exact_zero_free"] == scalars["recall/distance4x/exact"]
