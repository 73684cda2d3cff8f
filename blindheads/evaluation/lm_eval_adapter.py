"""An lm-evaluation-harness model for blindheads decoders: ``lm_eval`` tasks on Lightning checkpoints, or on the
folders ``blindheads export`` writes (``export_dir=DIR``: model and tokenizer from the folder, loaded with the
package's registered classes, no remote code run; lm-eval's own ``hf`` model needs ``accelerate``, which this
project does not install).

    blindheads lm_eval --model blindheads --model_args ckpt_path=runs/alibi/version_0/checkpoints/last.ckpt \\
        --tasks hellaswag,arc_easy,arc_challenge,piqa,winogrande,openbookqa,sciq,lambada_openai
    blindheads lm_eval --model blindheads --model_args export_dir=exported/demo,max_length=2048 \\
        --tasks ruler_niah_single_1 --include_path configs/lm_eval

Contexts longer than the evaluation window keep their most recent tokens (``max_length``, by default the model's
training context length).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

# The harness's own models (hf, vllm, ...) first: lm-eval fills its model registry only while it is empty, so ours
# registered alone would leave `--model hf` unknown to `blindheads lm_eval`.
import lm_eval.models  # noqa: F401
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, handle_arg_string, make_disjoint_window
from tqdm import tqdm

from blindheads.checkpoints.reading import load_checkpoint
from blindheads.checkpoints.rebuild import checkpoint_decoder, checkpoint_tokenizer
from blindheads.datamodules.tokenizer import default_cache_dir, load_tokenizer

if TYPE_CHECKING:  # for annotations only
    from transformers import PreTrainedModel


class ExportedDecoder(torch.nn.Module):
    """An exported folder's causal LM as the adapter calls a decoder: token ids in, logits out, and the context
    length it was trained at (``config.context_length``, from ``max_position_embeddings``)."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self.config = SimpleNamespace(context_length=model.config.max_position_embeddings)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False).logits


def exported_decoder(folder: str) -> ExportedDecoder:
    """The model of an export folder (a blindheads model's config checked against its weights first, one line)."""
    from transformers import AutoModelForCausalLM

    import blindheads.export.hf  # registers exported blindheads models: no remote code, no prompt

    config = Path(folder) / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("model_type") == "blindheads":
        blindheads.export.hf.check_export(Path(folder))
    return ExportedDecoder(AutoModelForCausalLM.from_pretrained(folder))


@register_model("blindheads")
class BlindheadsLM(TemplateLM):
    """Log-likelihoods, rolling log-likelihoods and greedy generation from one forward pass per batch."""

    def __init__(
        self,
        ckpt_path: str | None = None,
        export_dir: str | None = None,
        decoder=None,
        tokenizer=None,
        batch_size: int | str = 8,
        device: str = "cpu",
        max_length: int | None = None,
        max_gen_toks: int = 256,
    ) -> None:
        super().__init__()
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"  # lm_eval's CLI asks for cuda by default
        if ckpt_path is not None and export_dir is not None:
            raise ValueError("give model_args ckpt_path=PATH (a checkpoint) or export_dir=DIR (an export), not both")
        if export_dir is not None:  # an export: its tokenizer unless another is named
            decoder = exported_decoder(str(export_dir)).to(device)
            tokenizer = load_tokenizer(
                tokenizer if isinstance(tokenizer, str) else str(export_dir), default_cache_dir()
            )
        if ckpt_path is not None:
            checkpoint = load_checkpoint(ckpt_path)  # once: weights and tokenizer settings from the same load
            decoder = checkpoint_decoder(checkpoint, ckpt_path).to(device)
            if tokenizer is None or isinstance(tokenizer, str):  # a name or path given, else the run's own
                tokenizer = checkpoint_tokenizer(checkpoint, tokenizer)
        if decoder is None or tokenizer is None:
            raise ValueError("give model_args ckpt_path=PATH or export_dir=DIR (or a decoder and its tokenizer)")
        self.decoder, self.tokenizer = decoder.eval(), tokenizer
        self._device = next(decoder.parameters()).device
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self._max_length = int(max_length or decoder.config.context_length)
        self.max_gen_toks = int(max_gen_toks)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> BlindheadsLM:
        """``model_args="key=value,key=value"`` from Python (``lm_eval.simple_evaluate``), read by ``model_arguments``;
        an argument the model does not take is named in one line."""
        args = {key: handle_arg_string(value) for key, value in model_arguments(arg_string).items()}
        args |= {key: value for key, value in (additional_config or {}).items() if value is not None}
        valid = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        unknown = sorted(set(args) - set(valid))
        if unknown:
            raise ValueError(f"--model_args: unknown argument {unknown[0]!r}; valid: {', '.join(valid)}")
        return cls(**args)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer(string, add_special_tokens=bool(add_special_tokens)).input_ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    @torch.no_grad()
    def _continuation_scores(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Sum of log-probabilities of each continuation given its context, and whether greedy decoding would
        produce it; right-padded batches (causality keeps padding from touching real tokens)."""
        out = []
        for start in range(0, len(pairs), self.batch_size):
            batch = pairs[start : start + self.batch_size]
            inputs = [(context + continuation)[-(self.max_length + 1) :][:-1] for context, continuation in batch]
            width = max(len(x) for x in inputs)
            padded = torch.full((len(inputs), width), self.eot_token_id, dtype=torch.long)
            for row, tokens in enumerate(inputs):
                padded[row, : len(tokens)] = torch.tensor(tokens)
            logits = self.decoder(padded.to(self._device)).float()
            for row, ((_, continuation), tokens) in enumerate(zip(batch, inputs)):
                end = len(tokens)
                log_probs = F.log_softmax(logits[row, end - len(continuation) : end], dim=-1).cpu()
                target = torch.tensor(continuation)
                total = float(log_probs.gather(1, target[:, None]).sum())
                out.append((total, bool((log_probs.argmax(-1) == target).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self._continuation_scores([(context, continuation) for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        totals = []
        for request in tqdm(requests, disable=disable_tqdm):
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    self.tok_encode(request.args[0]), self.prefix_token_id, self.max_length, context_len=1
                )
            ]
            totals.append(sum(score for score, _ in self._continuation_scores(windows)))
        return totals

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding (the full prefix is recomputed each step: no KV cache) until a stop string."""
        outputs = []
        for request in tqdm(requests, disable=disable_tqdm):
            context, options = request.args
            until = options.get("until") or [self.tok_decode([self.eot_token_id])]
            until = [until] if isinstance(until, str) else until
            tokens, text = self.tok_encode(context), ""
            for _ in range(int(options.get("max_gen_toks", self.max_gen_toks))):
                window = torch.tensor([tokens[-self.max_length :]], device=self._device)
                following = int(self.decoder(window)[0, -1].argmax())
                if following == self.eot_token_id:
                    break
                tokens.append(following)
                text += self.tok_decode([following])
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            outputs.append(text)
        return outputs


def model_arguments(text: str) -> dict[str, str]:
    """``key=value,key=value``, where a comma not followed by ``key=`` belongs to the value: a checkpoint path may
    hold commas (lm-eval's own reader splits at every comma)."""
    pieces = [piece for piece in re.split(r",(?=\s*\w+=)", text.strip()) if piece]
    malformed = [piece for piece in pieces if "=" not in piece]
    if malformed:
        raise ValueError(f"--model_args {text!r}: {malformed[0]!r} is not key=value")
    return {key.strip(): value for key, _, value in (piece.partition("=") for piece in pieces)}
