"""What a probe writes: ``probe.json`` (valid JSON: no NaN or Infinity), ``probe.csv`` per length x layer x head,
and two figures of the longest length."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import torch

from blindheads.evaluation.figures import zero_share_by_distance, zero_share_heatmap
from blindheads.probes.published import LayerStatistics

CSV_COLUMNS = ["length", "layer", "head", "zero_share", "blind_distance", "predicted_normal", "predicted_subnormal",
               "deaf_share"]  # fmt: skip


def json_safe(value):
    """``value`` with every non-finite float (a NaN accuracy of an empty cell, an infinite distance) as ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_outputs(out: Path, summary: dict, results: list[LayerStatistics], predicted: dict[str, list[float]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n")
    with open(out / "probe.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(CSV_COLUMNS)
        for r in results:
            for layer, stats in enumerate(r.layers):
                columns = zip(stats.zero_share.tolist(), stats.blind_distance.tolist(), stats.deaf_share.tolist())
                for head, (share, distance, deaf) in enumerate(columns):
                    predictions = (predicted.get(mode, [None] * (head + 1))[head] for mode in ("normal", "subnormal"))
                    writer.writerow(
                        [r.length, layer, head, share, distance if math.isfinite(distance) else "", *predictions, deaf]
                    )
    longest = results[-1]
    heads = len(longest.layers[0].zero_share)
    normal = torch.tensor(predicted.get("normal", [math.inf] * heads))
    subnormal = torch.tensor(predicted["subnormal"]) if predicted else None
    title = f"{summary['model']} ({summary['dtype']}, {longest.length} tokens)"
    zero_share_by_distance(longest.layers, normal, subnormal, title).savefig(out / "measured_vs_predicted.png", dpi=120)
    zero_share_heatmap(longest.layers, title).savefig(out / "zero_share_heatmap.png", dpi=120)


def head_table(longest: LayerStatistics, predicted: dict[str, list[float]]) -> list[str]:
    """Per head at the longest length: the measured blind distance (the nearest over layers: from there on some
    layer's head gives every key exactly 0; ``-`` where none did within the length) beside the predicted one in each
    threshold mode, and a last line naming the mode the measurement matches (the nearer prediction in more heads)."""
    measured = torch.stack([s.blind_distance for s in longest.layers]).min(0).values.tolist()
    modes = [mode for mode in ("normal", "subnormal") if mode in predicted]

    def shown(value: float) -> str:
        return f"{value:.0f}" if math.isfinite(value) and value < longest.length else "-"

    lines = [f"  {longest.length} tokens, blind distance per head (tokens; '-': not within the length):",
             "    head  measured  " + "  ".join(f"{f'predicted {mode}':>19}" for mode in modes)]  # fmt: skip
    nearer = dict.fromkeys(modes, 0)
    for head, distance in enumerate(measured):
        row = [predicted[mode][head] for mode in modes]
        lines.append(f"    {head:>4}  {shown(distance):>8}  " + "  ".join(f"{shown(v):>19}" for v in row))
        seen = [v if math.isfinite(v) and v < longest.length else math.inf for v in row]
        if math.isfinite(distance) and any(math.isfinite(v) for v in seen):
            nearer[modes[min(range(len(modes)), key=lambda i: abs(seen[i] - distance))]] += 1
    compared = sum(nearer.values())
    if not compared:
        lines.append("  no head is blind within the length where a prediction says it should be: no threshold matched")
    else:
        best = max(nearer, key=nearer.__getitem__)
        lines.append(
            f"  the measurement matches the {best} threshold (nearer in {nearer[best]} of {compared} heads blind on "
            f"both counts): its softmax {'kept' if best == 'subnormal' else 'flushed'} subnormals"
        )
    return lines
