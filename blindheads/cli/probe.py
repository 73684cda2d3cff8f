"""``blindheads probe``: measured attention underflow of a published model beside the calculator's prediction."""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import torch
from torch import nn

from blindheads.evaluation.figures import zero_share_by_distance, zero_share_heatmap
from blindheads.numerics import DTYPES
from blindheads.probes.published import LayerStatistics, load_published, measure, predicted_blind_distances, summarize
from blindheads.probes.score_paths import match_default_attention, score_path
from blindheads.probes.text import documents, token_stream


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="blindheads probe", description=__doc__)
    parser.add_argument("--model", required=True, help="Hub name or local directory of a causal LM")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--text", nargs="+", default=["builtin"], help="'builtin' or parquet/jsonl/txt files")
    parser.add_argument("--samples", type=int, default=1, help="sequences per length")
    parser.add_argument("--out", help="output directory (default: probes/<model name>)")
    parser.add_argument("--retrieval", action="store_true", help="also run passkey and needle with its tokenizer")
    args = parser.parse_args(argv)
    if any(n < 2 for n in args.lengths) or args.samples < 1:
        parser.error(f"lengths must be >= 2 and samples >= 1, got {args.lengths} and {args.samples}")
    return args


class TransformersDecoder(nn.Module):
    """The ``hidden_states`` / ``lm_head`` view of a transformers causal LM that the retrieval scorer uses."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.lm_head = model, model.get_output_embeddings()

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.base_model(tokens, use_cache=False).last_hidden_state


def write_outputs(out: Path, summary: dict, results: list[LayerStatistics], predicted: dict[str, list[float]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n")
    with open(out / "probe.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            ["length", "layer", "head", "zero_share", "blind_distance", "predicted_normal", "predicted_subnormal"]
        )
        for r in results:
            for layer, stats in enumerate(r.layers):
                for head, (share, distance) in enumerate(zip(stats.zero_share.tolist(), stats.blind_distance.tolist())):
                    writer.writerow(
                        [
                            r.length,
                            layer,
                            head,
                            share,
                            distance if math.isfinite(distance) else "",
                            *(predicted.get(m, [None] * (head + 1))[head] for m in ("normal", "subnormal")),
                        ]
                    )
    longest = results[-1]
    heads = len(longest.layers[0].zero_share)
    normal = torch.tensor(predicted.get("normal", [math.inf] * heads))
    subnormal = torch.tensor(predicted["subnormal"]) if predicted else None
    title = f"{summary['model']} ({summary['dtype']}, {longest.length} tokens)"
    zero_share_by_distance(longest.layers, normal, subnormal, title).savefig(out / "measured_vs_predicted.png", dpi=120)
    zero_share_heatmap(longest.layers, title).savefig(out / "zero_share_heatmap.png", dpi=120)


def json_safe(value):
    """``value`` with every non-finite float (a NaN accuracy of an empty cell, an infinite distance) as ``None``:
    JSON has no NaN or Infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    model, tokenizer = load_published(args.model, args.dtype)
    notes = match_default_attention(model)
    texts = documents(args.text)
    lengths = sorted(args.lengths)
    stream = token_stream(tokenizer, texts, args.samples * max(lengths))
    results = [LayerStatistics(n, measure(model, stream[: args.samples * n].view(args.samples, n))) for n in lengths]
    path = score_path(model)
    predicted = predicted_blind_distances(path, args.dtype)
    summary = summarize(args.model, args.dtype, path, notes, results, predicted)
    if args.retrieval:
        summary["retrieval"] = retrieval(model, tokenizer, stream, lengths)
    out = Path(args.out or Path("probes") / Path(args.model).name)
    write_outputs(out, summary, results, predicted)
    print(f"probe of {args.model}: {len(results[0].layers)} layers, lengths {lengths}; results in {out}/")
    for r in results:
        shares = torch.stack([s.zero_share for s in r.layers])
        print(
            f"  {r.length:>6} tokens: {shares.mean():.2%} of causal weights exactly zero (max head {shares.max():.2%})"
        )
    return summary


def retrieval(model, tokenizer, stream: torch.Tensor, lengths: list[int]) -> dict:
    from blindheads.evaluation.prompts import needle_samples, passkey_samples
    from blindheads.evaluation.scoring import score_samples
    from blindheads.evaluation.summary import GridSummary

    decoder, depths = TransformersDecoder(model), [0.0, 0.5, 1.0]
    context = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "max_seq_len", max(lengths)
    )
    tasks = {
        "passkey": passkey_samples(tokenizer, lengths, depths, 2),
        "needle": needle_samples(tokenizer, stream.tolist(), lengths, depths, 2),
    }
    out = {}
    for task, samples in tasks.items():
        scores = score_samples(decoder, tokenizer, samples, batch_size=1)
        exact = torch.tensor([s.exact for s in scores], dtype=torch.float64).view(len(lengths), len(depths), 2)
        digits = torch.tensor([s.digits for s in scores], dtype=torch.float64).view(len(lengths), len(depths), 2)
        out[task] = GridSummary(
            lengths,
            depths,
            context,
            exact.mean(-1).numpy(),
            digits.mean(-1).numpy(),
            torch.full((len(lengths), len(depths)), 2.0).numpy(),
        ).to_dict()
    return out
