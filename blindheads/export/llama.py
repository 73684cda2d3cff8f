"""A RoPE decoder as a plain transformers ``LlamaForCausalLM``: the same blocks (pre-norm RMSNorm, grouped-query
attention with RoPE's rotate-half pairs, SwiGLU, no biases), so its weights load into Llama renamed, and the export
needs no remote code and no blindheads where it loads."""

from __future__ import annotations

from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder
from blindheads.modules.position.rope import RoPE

RENAMES = (  # blindheads' name part -> Llama's, in the order they are applied
    ("decoder.embed.", "model.embed_tokens."),
    ("decoder.blocks.", "model.layers."),
    ("decoder.norm.", "model.norm."),
    ("decoder.lm_head.", "lm_head."),
    (".attn_norm.", ".input_layernorm."),
    (".mlp_norm.", ".post_attention_layernorm."),
    (".attn.", ".self_attn."),
)


def rope_theta(decoder: Decoder) -> float | None:
    """The RoPE base when the decoder is a Llama (its position stack RoPE alone), else ``None``."""
    components = list(decoder.position)
    if len(components) == 1 and type(components[0]) is RoPE:
        return components[0].theta
    return None


def llama_config(config: DecoderConfig, theta: float, **kwargs) -> LlamaConfig:
    """The ``LlamaConfig`` of the same shape; the attention and MLP have no biases, the head size is the decoder's."""
    assert config.hidden_size and config.mlp_size and config.num_layers and config.num_heads  # DecoderConfig fills
    assert config.context_length  # its shape
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.mlp_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_size,
        max_position_embeddings=config.context_length,
        rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        **kwargs,
    )


def llama_name(name: str) -> str:
    for old, new in RENAMES:
        name = name.replace(old, new)
    return name


def as_llama(decoder: Decoder, **config_kwargs) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` holding ``decoder``'s weights (refused, naming its stack, unless it is RoPE alone)."""
    theta = rope_theta(decoder)
    if theta is None:
        raise ValueError(f"position {decoder.config.position!r} is not RoPE alone: it has no Llama equivalent")
    model = LlamaForCausalLM(llama_config(decoder.config, theta, **config_kwargs))
    state: dict[str, Tensor] = {llama_name(f"decoder.{k}"): v for k, v in decoder.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if decoder.config.tie_embeddings else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"the decoder's weights do not fill a Llama: missing {missing}, unexpected {unexpected}")
    if decoder.config.tie_embeddings:
        model.tie_weights()
    nn.Module.to(model, decoder.embed.weight.dtype)  # the decoder's dtype (transformers' wrapped ``to`` confuses mypy)
    return model
