"""The Hugging Face classes of an exported blindheads model. The export ships this module, with the modules it
imports, in the model's folder (``blindheads.export.remote``), so ``AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)`` loads it with transformers alone: it imports nothing but the decoder's modules, torch and
transformers."""

from __future__ import annotations

from dataclasses import asdict

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from blindheads.modules.config import DecoderConfig, config_from_fields
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
