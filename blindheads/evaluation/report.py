"""The short summary ``blindheads test`` ends with: what a reader wants from ``results.json`` at a glance."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from blindheads.evaluation.attribution import CARRIES
from blindheads.evaluation.tags import (
    BLIND_DISTANCE,
    EXTRAPOLATION,
    PREDICTED,
    RECALL,
    RECALL_HEAD,
    at_stage,
    distance_point,
    loss_tag,
    recall_head_tag,
    recall_tag,
    retrieval_tag,
)


def run_report(metrics: dict[str, float], log_dir: str | None = None) -> list[str]:
    """Loss (held-out text, and by length), each head's measured against predicted blind distance, recall by
    distance with its re-scores, the heads that carry recall and where each goes blind, what the re-scores say
    about blindness, passkey and needle, where the logs are and what to run next; parts a run did not measure are
    left out."""
    lines = []
    if loss_tag("test/") in metrics:
        by_length = sorted(
            (int(m["factor"]), metrics[m.string]) for m in at_stage(EXTRAPOLATION, metrics) if m["part"] == "loss"
        )
        lengths = "; by length " + ", ".join(f"{f}x {v:.2f}" for f, v in by_length) if by_length else ""
        lines.append(f"held-out loss on natural text {metrics[loss_tag('test/')]:.3f}{lengths}")
        lines.append("  (nats per token; the training loss also counts the retrieval episodes mixed into training)")
    lines += _blindness(metrics)
    lines += _recall(metrics)
    lines += _carriers(metrics)
    for task in ("passkey", "needle"):
        auc_in, auc_out = (
            metrics.get(retrieval_tag(task, f"auc_{d}", "test/")) for d in ("in_domain", "out_of_domain")
        )
        if auc_in is not None or auc_out is not None:
            lines.append(f"{task}: AUC {_number(auc_in)} inside the training length, {_number(auc_out)} beyond")
    if log_dir:
        lines.append(f"TensorBoard: {tensorboard_command()} --logdir {log_dir}")
    if _recall_points(metrics):
        lines.append(f"next: one run is one seed; the grid compares setups seed by seed: {NEXT}")
    return lines


NEXT = "blindheads grid --setups alibi nope wide_clamp_log_distance --seeds 0 1 2 (results/README.md: the full grid)"


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


def _recall_points(metrics: dict[str, float]) -> list[float]:
    return sorted(float(m["distance"]) for m in at_stage(RECALL, metrics) if m["distance"] and m["part"] == "exact")


def _recall(metrics: dict[str, float]) -> list[str]:
    factors = _recall_points(metrics)
    if not factors:
        return []
    rows = {"distance (tokens)": "distance", "episode length": "length", "exact recall": "exact",
            "best constant": "baseline", "no exact zeros": "exact_zero_free", "bias floored": "exact_floored",
            "bias capped": "exact_capped", "fact weights 0": "zeros", "blind in all heads": "blind"}  # fmt: skip
    header = "".join(f"{f'{f:g}x':>8}" for f in factors)
    lines = ["held-out recall by answer distance (x the training window):", f"  {'':<19}{header}"]
    for label, part in rows.items():
        values = [metrics.get(recall_tag(distance_point(f), part, "test/")) for f in factors]
        if all(v is None for v in values):
            continue  # a record from before the row existed, or an evaluation without it (zero_free, floor, attribution)
        whole = part in ("distance", "length")
        cells = "".join(f"{v:>8.0f}" if whole and v is not None else f"{_number(v):>8}" for v in values)
        lines.append(f"  {label:<19}{cells}")
    notes = {
        "baseline": "best constant: what always answering the most common value scores",
        "exact_zero_free": "no exact zeros: the same episodes with the model in float64, where no weight underflows",
        "exact_floored": "bias floored: every bias held at or above the recall callback's floor",
        "exact_capped": "bias capped: every head's bias beyond the window held at its value at the window's edge",
        "zeros": "fact weights 0: share of the fact's weights, over episodes, layers and heads, exactly 0",
        "blind": "blind in all heads: every layer-head gives the fact exactly 0 (rare: a shallow head still sees it)",
    }
    for part, note in notes.items():
        if any(recall_tag(distance_point(f), part, "test/") in metrics for f in factors):
            lines.append(f"  ({note})")
    return lines


def _carriers(metrics: dict[str, float]) -> list[str]:
    """The heads that carry recall (ablation cost at least ``attribution.CARRIES``), where each goes exactly blind,
    and one line on what the zero-free re-score says at those distances."""
    costs = {(int(m["layer"]), int(m["head"])): metrics[m.string]
             for m in at_stage(RECALL_HEAD, metrics) if m["name"] == "ablation_cost"}  # fmt: skip
    carriers = sorted((key for key, cost in costs.items() if cost >= CARRIES), key=lambda k: -costs[k])
    if not costs:
        return []
    if not carriers:
        return [f"heads that carry recall (ablation cost >= {CARRIES}): none"]
    lines = [f"heads that carry recall (ablation cost >= {CARRIES}: the share of in-window answers lost without it):"]
    blind_from = []
    for layer, head in carriers:
        by = metrics.get(recall_head_tag(layer, head, "blind_by", "test/"))
        where = "not exactly blind at any distance measured"
        if by is not None:
            blind_from.append(by)
            at = metrics.get(recall_head_tag(layer, head, "exact_at_blind_by", "test/"))
            where = f"exactly blind from {by:.0f} tokens (recall there {_number(at)})"
        lines.append(f"  l{layer}h{head}: cost {costs[(layer, head)]:.2f}, {where}")
    rescored = [
        (f, metrics[recall_tag(distance_point(f), "exact_zero_free", "test/")] - metrics[recall_tag(distance_point(f), "exact", "test/")])
        for f in _recall_points(metrics)
        if blind_from and metrics.get(recall_tag(distance_point(f), "distance", "test/"), 0) >= min(blind_from)
        and recall_tag(distance_point(f), "exact_zero_free", "test/") in metrics
        and metrics.get(recall_tag(distance_point(f), "zeros_zero_free", "test/")) == 0
    ]  # fmt: skip
    if rescored:
        largest = max(rescored, key=lambda fd: abs(fd[1]))
        lines.append(f"  where a carrier is blind ({', '.join(f'{f:g}x' for f, _ in rescored)}), removing the exact "
                     f"zeros (float64) changes recall by at most {largest[1]:+.2f} ({largest[0]:g}x): what the zeros "
                     "cost at evaluation, in one seed (README: what the grid decides)")  # fmt: skip
    return lines


def _number(value, spec: str = ".2f") -> str:
    if value is None:
        return "n/a"
    return "inf" if isinstance(value, float) and math.isinf(value) else format(value, spec)
