"""The short summary ``blindheads test`` ends with: what a reader wants from ``results.json`` at a glance."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from blindheads.evaluation.tags import (
    BLIND_DISTANCE,
    EXTRAPOLATION,
    PREDICTED,
    RECALL,
    at_stage,
    distance_point,
    loss_tag,
    recall_tag,
    retrieval_tag,
)


def run_report(metrics: dict[str, float], log_dir: str | None = None) -> list[str]:
    """Loss (and by length), each head's measured against predicted blind distance, recall by distance with its
    blind / reachable split, passkey and needle, and where the logs are; parts a run did not measure are left out."""
    lines = []
    if loss_tag("test/") in metrics:
        by_length = sorted(
            (int(m["factor"]), metrics[m.string]) for m in at_stage(EXTRAPOLATION, metrics) if m["part"] == "loss"
        )
        lengths = "; by length " + ", ".join(f"{f}x {v:.2f}" for f, v in by_length) if by_length else ""
        lines.append(f"held-out loss {metrics[loss_tag('test/')]:.3f}{lengths}")
    lines += _blindness(metrics)
    lines += _recall(metrics)
    for task in ("passkey", "needle"):
        auc_in, auc_out = (
            metrics.get(retrieval_tag(task, f"auc_{d}", "test/")) for d in ("in_domain", "out_of_domain")
        )
        if auc_in is not None or auc_out is not None:
            lines.append(f"{task}: AUC {_number(auc_in)} inside the training length, {_number(auc_out)} beyond")
    if log_dir:
        lines.append(f"TensorBoard: {tensorboard_command()} --logdir {log_dir}")
    return lines


def tensorboard_command() -> str:
    """``tensorboard`` as this interpreter's environment has it (``.venv/bin/tensorboard``): it works from a shell
    where the environment is not activated."""
    beside = Path(sys.executable).parent / "tensorboard"
    if not beside.exists():
        return "tensorboard"
    relative = os.path.relpath(beside)
    return relative if not relative.startswith("..") else str(beside)


def _blindness(metrics: dict[str, float]) -> list[str]:
    predictions = at_stage(PREDICTED, metrics)
    predicted = {int(m["head"]): metrics[m.string] for m in predictions if m["softmax"] == "materialized"}
    fused = {int(m["head"]): metrics[m.string] for m in predictions if m["softmax"] == "fused"}
    measured: dict[int, list[float]] = {}
    for match in at_stage(BLIND_DISTANCE, metrics):
        measured.setdefault(int(match["head"]), []).append(metrics[match.string])
    heads = sorted(set(predicted) | set(measured))
    if not heads:
        return []
    lines = ["blind beyond (tokens): measured in eager weights (min-max over layers) / predicted, materialized:"]
    for head in heads:
        seen = measured.get(head)
        span = f"{min(seen):.0f}-{max(seen):.0f}" if seen else "not blind within the lengths measured"
        lines.append(f"  head {head}: {span} / {_number(predicted.get(head), '.1f')}")
    if measured:
        lines.append(
            "  (measured: past the farthest non-zero weight of any query, q.k included, so a query scoring far keys "
            "above near ones moves it out; predicted: the bias alone, q.k = 0)"
        )
    if fused:
        lines.append(
            "  (materialized: the eager and SDPA softmax, whose normalised weights go blind ln(Z)/slope tokens "
            "sooner than the fused kernels' exp(x - max), e.g. head "
            f"{min(fused)} at {fused[min(fused)]:.1f} there; see blindheads blindness --softmax)"
        )
    return lines


def _recall(metrics: dict[str, float]) -> list[str]:
    factors = sorted(float(m["distance"]) for m in at_stage(RECALL, metrics) if m["distance"] and m["part"] == "exact")
    if not factors:
        return []
    rows = {"distance (tokens)": "distance", "episode length": "length", "exact recall": "exact",
            "best constant": "baseline", "fact blind": "blind", "failed, blind": "failed_blind",
            "failed, reachable": "failed_reachable", "under a cap": "exact_capped"}  # fmt: skip
    header = "".join(f"{f'{f:g}x':>8}" for f in factors)
    lines = ["held-out recall by answer distance (x the training window):", f"  {'':<18}{header}"]
    for label, part in rows.items():
        values = [metrics.get(recall_tag(distance_point(f), part, "test/")) for f in factors]
        if all(v is None for v in values):
            continue  # a record from before the row existed, or an evaluation without it (the cap: attribution)
        whole = part in ("distance", "length")
        cells = "".join(f"{v:>8.0f}" if whole and v is not None else f"{_number(v):>8}" for v in values)
        lines.append(f"  {label:<18}{cells}")
    lines.append("  (best constant: what always answering the most common value scores)")
    lines.append("  (blind: every layer-head gives the fact exactly 0 weight from the answer's query)")
    return lines


def _number(value, spec: str = ".2f") -> str:
    if value is None:
        return "n/a"
    return "inf" if isinstance(value, float) and math.isinf(value) else format(value, spec)
