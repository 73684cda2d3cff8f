"""Measure exactly-zero attention weights in a transformers causal LM, one layer at a time."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from blindheads.blindness import blind_distances
from blindheads.checkpoints.reading import refused_code
from blindheads.datamodules.hub import require_hub
from blindheads.evaluation.contexts import forward_hooks
from blindheads.evaluation.underflow import ZeroStatistics, mean_zero_share_by_distance, zero_statistics
from blindheads.modules.position import ALiBi, PositionStack
from blindheads.numerics import LEARNING_HORIZON, THRESHOLDS, resolve_dtype, tau
from blindheads.probes.retrieval import retrieval_sweeps
from blindheads.probes.score_paths import ScorePath, score_path
from blindheads.probes.text import documents, token_stream

if TYPE_CHECKING:  # for annotations only
    from transformers import PreTrainedModel

    from blindheads.export.hf import BlindheadsForCausalLM
    from blindheads.modules.decoder import Block


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def load_published(name: str, dtype: str = "float32"):
    """Model (eager attention, eval mode) and tokenizer from a local directory (a blindheads export too), the Hub's
    cache, or the Hub, asked first whether it is reachable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import blindheads.export.hf  # registers exported blindheads models: no remote code, no prompt

    local = Path(name).exists()
    if local and Path(name).is_dir() and not any((Path(name) / file).exists() for file in TOKENIZER_FILES):
        raise ValueError(
            f"model folder {name} has no tokenizer files ({', '.join(TOKENIZER_FILES)}): save the model's tokenizer "
            "beside it (tokenizer.save_pretrained(FOLDER))"
        )
    if local and _model_type(Path(name)) == "blindheads":
        blindheads.export.hf.check_export(Path(name))
    if not local:
        try:
            AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False)
        except OSError:
            try:
                require_hub(f"model {name!r}", "download it first or pass a local directory")
            except ConnectionError as error:
                raise ValueError(str(error)) from None
    try:
        model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="eager", dtype=resolve_dtype(dtype))
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)  # a tokenizer runs no code
    except pickle.UnpicklingError as error:  # transformers unpickles ``.bin`` weights with ``weights_only``
        raise ValueError(
            f"cannot load model {name!r}: {refused_code(error) or 'its weights file is damaged'}"
        ) from None
    except RuntimeError as error:  # transformers' report of weights whose shapes the config does not make
        if "mismatched" not in str(error) and "size mismatch" not in str(error):
            raise
        raise ValueError(f"cannot load model {name!r}: its config.json does not match its weights' shapes") from None
    except OSError as error:
        raise ValueError(
            f"cannot load model {name!r}: it is not a local model directory and the Hugging Face Hub did not "
            f"provide it ({error.__class__.__name__}); download it first or pass a local path"
        ) from None
    return model.eval(), tokenizer


def _model_type(folder: Path) -> str | None:
    """The ``model_type`` in a model directory's ``config.json``, None where there is none to read."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The per-layer self-attention modules: outermost modules whose class name ends in ``Attention`` (in an exported
    blindheads model, each block's ``AttentionWeights``)."""
    if model.config.model_type == "blindheads":
        decoder = cast("BlindheadsForCausalLM", model).decoder
        return [block.attn.weights for block in cast("list[Block]", decoder.blocks)]  # a ModuleList of Blocks
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if type(module).__name__.endswith("Attention") and not any(name.startswith(f"{p}.") for p, _ in found):
            found.append((name, module))
    if not found:
        raise ValueError(f"found no attention modules in {type(model).__name__}")
    return [module for _, module in found]


@dataclass
class LayerStatistics:
    length: int
    layers: list[ZeroStatistics]


@torch.no_grad()
def measure(model: PreTrainedModel, tokens: torch.Tensor) -> list[ZeroStatistics]:
    """Each layer's attention weights on ``tokens`` (batch, L), reduced in a hook and then dropped."""
    per_layer: dict[int, ZeroStatistics] = {}

    def reduce(index):
        def hook(module, inputs, output):
            if isinstance(output, torch.Tensor):  # blindheads' AttentionWeights hand out the weights themselves
                per_layer[index] = zero_statistics(output)
                return None
            weights = next((o for o in output[1:] if isinstance(o, torch.Tensor) and o.dim() == 4), None)
            if weights is None:
                raise RuntimeError(
                    f"{type(module).__name__} returned no attention weights: load it with eager attention"
                )
            per_layer[index] = zero_statistics(weights)
            return tuple(None if o is weights else o for o in output)  # do not keep every layer's weights

        return hook

    with forward_hooks(attention_modules(model), reduce):
        if model.config.model_type == "blindheads":
            cast("BlindheadsForCausalLM", model).decoder.hidden_states(tokens.to(model.device), attention="eager")
        else:
            model(tokens.to(model.device), output_attentions=True, use_cache=False)
    return [per_layer[i] for i in sorted(per_layer)]


def _alibi(path: ScorePath) -> PositionStack | None:
    if path.slopes is None:
        return None
    return PositionStack([ALiBi(path.slopes.tolist(), num_heads=len(path.slopes))], len(path.slopes))


def predicted_blind_distances(path: ScorePath, dtype: str) -> dict[str, list[float]]:
    """Per threshold mode, each head's predicted blindness distance (bias alone)."""
    stack = _alibi(path)
    return {} if stack is None else {mode: blind_distances(stack, tau(dtype, mode)).tolist() for mode in THRESHOLDS}


def predicted_horizon_distances(path: ScorePath) -> list[float] | None:
    """Each head's predicted horizon distance: where its bias alone passes ``LEARNING_HORIZON`` nats."""
    stack = _alibi(path)
    return None if stack is None else blind_distances(stack, LEARNING_HORIZON).tolist()


def summarize(
    model_name: str,
    dtype: str,
    path: ScorePath,
    results: list[LayerStatistics],
    predicted: dict[str, list[float]],
) -> dict:
    """Everything a notebook needs: per length, per layer x head measured zero share, share past the learning
    horizon (below e^-H of the row's largest) and blindness distance; the underflow share by distance per head (mean
    over layers); the prediction in both threshold modes and each head's horizon distance (JSON has no infinity: a
    head never blind is ``None``)."""
    horizons = predicted_horizon_distances(path)

    def finite(values):
        return [v if math.isfinite(v) else None for v in values]

    return {
        "model": model_name,
        "architecture": path.architecture,
        "dtype": dtype,
        "softmax": path.softmax,
        "notes": path.notes,
        "slopes": None if path.slopes is None else path.slopes.tolist(),
        "tau": {mode: tau(dtype, mode) for mode in THRESHOLDS},
        "predicted_blind_distance": {mode: finite(v) for mode, v in predicted.items()},
        "learning_horizon": LEARNING_HORIZON,
        "predicted_horizon_distance": None if horizons is None else finite(horizons),
        "lengths": [
            {
                "length": r.length,
                "zero_share": [s.zero_share.tolist() for s in r.layers],
                "deaf_share": [s.deaf_share.tolist() for s in r.layers],
                "blind_distance": [finite(s.blind_distance.tolist()) for s in r.layers],
                "zero_share_by_distance": mean_zero_share_by_distance(r.layers).tolist(),
            }
            for r in results
        ],
    }


def probe(
    model_name: str, dtype: str, text: list[str], lengths: list[int], samples: int, retrieval: bool = False
) -> tuple[dict, list[LayerStatistics], dict[str, list[float]]]:
    """Load a model, measure its zero weights on ``samples`` sequences of ``text`` per length, predict them from its
    score path, and (``retrieval``) run passkey and needle with its tokenizer: the summary, the per-length
    statistics and the predictions."""
    model, tokenizer = load_published(model_name, dtype)
    lengths = sorted(lengths)
    stream = token_stream(tokenizer, documents(text), samples * max(lengths))
    results = [LayerStatistics(n, measure(model, stream[: samples * n].view(samples, n))) for n in lengths]
    path = score_path(model)
    predicted = predicted_blind_distances(path, dtype)
    summary = summarize(model_name, dtype, path, results, predicted)
    if retrieval:
        summary["retrieval"] = retrieval_sweeps(model, tokenizer, stream, lengths)
    return summary, results, predicted
