"""A Hugging Face ``PreTrainedModel`` around the blindheads decoder, so exported checkpoints load with
``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` (with this package installed)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from blindheads.checkpoints.rebuild import check_weights, config_from_fields
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder


class BlindheadsConfig(PretrainedConfig):
    """Every ``DecoderConfig`` field under ``decoder_fields`` (``decoder`` would mean an encoder-decoder's part)."""

    model_type = "blindheads"

    def __init__(self, decoder_fields: dict | None = None, **kwargs) -> None:
        self.decoder_fields = dict(decoder_fields or {})
        config = self.decoder_config()
        standard = {  # the names other tools read; a saved config.json carries them already
            "tie_word_embeddings": config.tie_embeddings,
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads,
            "max_position_embeddings": config.context_length,
        }
        super().__init__(**{**standard, **kwargs})

    def decoder_config(self) -> DecoderConfig:
        """The decoder's config; an unknown field (a config.json edited by hand) is refused, not dropped."""
        return config_from_fields(self.decoder_fields, "config.json: its decoder_fields")

    @classmethod
    def from_decoder_config(cls, config: DecoderConfig, **kwargs) -> BlindheadsConfig:
        return cls(decoder_fields=asdict(config), **kwargs)


class BlindheadsForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = BlindheadsConfig
    base_model_prefix = "decoder"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"decoder.lm_head.weight": "decoder.embed.weight"}

    def __init__(self, config: BlindheadsConfig) -> None:
        super().__init__(config)
        if not config.decoder_config().tie_embeddings:
            self._tied_weights_keys = {}
        self.decoder = Decoder(config.decoder_config())
        self.post_init()

    def _init_weights(self, module) -> None:
        """Weights come from the checkpoint; the decoder initialises itself when built."""

    def get_input_embeddings(self):
        return self.decoder.embed

    def get_output_embeddings(self):
        return self.decoder.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutput:
        """Full-sequence forward (no KV cache: generation recomputes the prefix). Left padding is not supported:
        pad on the right, where causality keeps real tokens unaffected."""
        logits = self.decoder(input_ids)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, **kwargs) -> dict:
        return {"input_ids": input_ids}


def check_export(folder: Path) -> None:
    """An exported model's ``config.json`` against its weights' shapes, read from the safetensors header (no weight
    is loaded, no model built): one line naming the mismatch, not transformers' report and traceback."""
    try:
        config = BlindheadsConfig.from_pretrained(folder).decoder_config()
    except ValueError as error:
        raise ValueError(f"{folder}/{error}") from None
    weights = folder / "model.safetensors"
    if not weights.is_file():  # sharded or another format: transformers' own checks
        return
    with safe_open(weights, "pt") as file:
        shapes = {key.removeprefix("decoder."): tuple(file.get_slice(key).get_shape()) for key in file.keys()}  # noqa: SIM118  (a safetensors file, not a dict)
    if config.tie_embeddings and "embed.weight" in shapes:  # saved once, under the embedding's name
        shapes.setdefault("lm_head.weight", shapes["embed.weight"])
    check_weights(config, shapes, folder)


# Importing this module makes exported directories load with the Auto classes and no remote code (and so no
# "trust_remote_code [y/N]" prompt, which AutoTokenizer also raises: it reads config.json's auto_map first).
AutoConfig.register(BlindheadsConfig.model_type, BlindheadsConfig, exist_ok=True)
AutoModelForCausalLM.register(BlindheadsConfig, BlindheadsForCausalLM, exist_ok=True)
