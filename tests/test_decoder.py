"""The decoder: shapes, the 148M preset, equality with transformers' Llama, and config errors."""

import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from blindheads.modules import Decoder, DecoderConfig
from blindheads.modules.config import load_decoder_config


def test_smollm_148m_parameter_count():
    with torch.device("meta"):
        model = Decoder(DecoderConfig.from_preset("smollm-148m"))
    c = model.config
    per_layer = 4 * c.hidden_size**2 + 3 * c.hidden_size * c.mlp_size + 2 * c.hidden_size
    assert model.num_parameters() == c.vocab_size * c.hidden_size + c.num_layers * per_layer + c.hidden_size
    assert model.num_parameters() == 147_786_048
    assert model.lm_head.weight is model.embed.weight


def test_initialisation_uses_init_std():
    model = Decoder(DecoderConfig.from_preset("tiny", hidden_size=256, mlp_size=512, init_std=0.02))
    assert model.blocks[0].mlp.up_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_untied_head_is_separate():
    model = Decoder(DecoderConfig.from_preset("tiny", tie_embeddings=False))
    assert model.lm_head.weight is not model.embed.weight


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_rope_decoder_equals_transformers_llama(attention):
    config = DecoderConfig.from_preset("tiny", position="rope(10000.0)", attention=attention, tie_embeddings=True)
    ours = Decoder(config).eval()
    hf_config = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.mlp_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        rms_norm_eps=config.norm_eps,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        max_position_embeddings=config.context_length,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )
    hf = LlamaForCausalLM(hf_config).eval()
    state = {
        "model.embed_tokens.weight": ours.embed.weight,
        "model.norm.weight": ours.norm.weight,
        "lm_head.weight": ours.lm_head.weight,
    }
    for i, block in enumerate(ours.blocks):
        prefix = f"model.layers.{i}."
        state[prefix + "input_layernorm.weight"] = block.attn_norm.weight
        state[prefix + "post_attention_layernorm.weight"] = block.mlp_norm.weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[prefix + f"self_attn.{name}.weight"] = getattr(block.attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            state[prefix + f"mlp.{name}.weight"] = getattr(block.mlp, name).weight
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in key for key in missing)
    tokens = torch.randint(0, config.vocab_size, (2, 48))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(tokens).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "position",
    [
        "alibi(wide)+clamp+log_distance",
        ["alibi(wide)", "clamp", "log_distance"],
        [{"alibi": {"slopes": "wide"}}, "clamp", {"log_distance": None}],
        [
            {"class_path": "blindheads.modules.position.ALiBi", "init_args": {"slopes": "wide"}},
            {"class_path": "blindheads.modules.position.Clamp"},
            {"class_path": "blindheads.modules.position.LogDistance"},
        ],
    ],
)
def test_every_spec_form_builds_the_same_stack(position):
    tokens = torch.randint(0, 512, (1, 32))
    torch.manual_seed(0)
    reference = Decoder(DecoderConfig.from_preset("tiny", position="alibi(wide)+clamp+log_distance"))(tokens)
    torch.manual_seed(0)
    model = Decoder(DecoderConfig.from_preset("tiny", position=position))
    assert [type(c).__name__ for c in model.position] == ["ALiBi", "Clamp", "LogDistance"]
    torch.testing.assert_close(model(tokens), reference)


@pytest.mark.parametrize(
    "position, message",
    [
        ("alibi+bogus", "unknown position component 'bogus'; valid: alibi, clamp, fire"),
        ("alibi(slopes=[1.0])", "1 slopes for 4 heads"),
        ("soft_cap(where=middle)", "where='middle' is not one of"),
        ("soft_cap(-1)", "cap must be positive"),
        ("clamp(3)", "floor must be negative"),
        ("sliding_window(0)", "size must be >= 1"),
        ("rope(0.5)", "theta must be > 1"),
        ("alibi(colour=3)", "bad arguments for position component 'alibi'"),
        ("alibi(", "cannot parse position component"),
        ([{"class_path": "torch.nn.Linear"}], "is not a PositionComponent"),
        ([42], "cannot read position entry 42"),
        ("", "cannot parse position component"),
    ],
)
def test_bad_position_specs_name_the_value_and_the_choices(position, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Decoder(DecoderConfig.from_preset("tiny", position=position))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_heads": 3}, "not divisible by num_heads 3"),
        ({"num_kv_heads": 3}, "not a multiple of num_kv_heads 3"),
        ({"hidden_size": 0}, "hidden_size must be >= 1"),
        ({"init_std": 1e6}, r"init_std must be in \(0, 1\], got 1000000.0"),
        ({"colour": 1}, "unknown decoder fields"),
        ({"softmax_dtype": "int8"}, "valid: float64, float32, bfloat16, float16"),
    ],
)
def test_bad_decoder_configs_fail_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Decoder(DecoderConfig.from_preset("tiny", **kwargs))


def test_unknown_preset():
    with pytest.raises(ValueError, match="valid: smollm-148m, tiny"):
        DecoderConfig.from_preset("gpt5")


def test_load_decoder_config_from_training_layout(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  decoder:\n    size: tiny\n    position: alibi(safe)+clamp\n    num_heads: 8\n")
    config = load_decoder_config(path)  # the size fills the shape fields not given; a value given wins
    assert (config.num_heads, config.num_kv_heads, config.hidden_size) == (8, 8, 64)
    assert config.position == "alibi(safe)+clamp"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_decoder_config(tmp_path / "missing.yaml")


def test_a_class_path_imports_only_modules_named_on_purpose(tmp_path, monkeypatch):
    """An exported config.json is loaded with trust_remote_code: its position spec must not import arbitrary code."""
    (tmp_path / "blindheads_test_payload.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('imported').write_text('ran')\n"
        "from blindheads.modules.position import NoPE\nclass Custom(NoPE):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = [{"class_path": "blindheads_test_payload.Custom"}]
    with pytest.raises(
        ValueError,
        match="module 'blindheads_test_payload' is not imported and not named in BLINDHEADS_POSITION_MODULES",
    ):
        Decoder(DecoderConfig.from_preset("tiny", position=spec))
    assert not (tmp_path / "imported").exists(), "refused before importing"
    monkeypatch.setenv("BLINDHEADS_POSITION_MODULES", "some.other, blindheads_test_payload")
    decoder = Decoder(DecoderConfig.from_preset("tiny", position=spec))
    assert type(decoder.position.components[0]).__name__ == "Custom" and (tmp_path / "imported").exists()
    monkeypatch.delitem(sys.modules, "blindheads_test_payload")


def test_rope_tables_made_under_inference_mode_serve_a_later_gradient_pass():
    """``test`` runs under inference mode, then ``GradientBlindness`` takes gradients at the same length."""
    decoder = Decoder(DecoderConfig.from_preset("tiny", position="rope", vocab_size=256, dtype="float32"))
    tokens = torch.randint(0, 256, (1, 32))
    with torch.inference_mode():
        decoder(tokens)
    with torch.inference_mode(False), torch.enable_grad():
        decoder(tokens).sum().backward()
    assert all(p.grad is not None for p in decoder.parameters() if p.requires_grad)
