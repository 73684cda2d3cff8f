"""The grid's tables, from its runs' records: one row per run, per setup (mean and spread over seeds), recall by
distance, per-head underflow and attribution, predicted blind distances."""

from __future__ import annotations

import math

import pandas as pd

from blindheads.evaluation.tags import (
    PREDICTED,
    RECALL,
    RECALL_HEAD,
    UNDERFLOW,
    at_stage,
    extrapolation_tag,
    loss_tag,
    retrieval_tag,
    underflow_mean_tag,
)

COLUMNS = {  # summary column -> test metric
    "val_loss": loss_tag("test/"),
    **{f"loss_{f}x": extrapolation_tag(f, prefix="test/") for f in (1, 2, 4, 8)},
    **{
        f"{task}_auc_{side}": retrieval_tag(task, f"auc_{domain}", "test/")
        for task in ("passkey", "needle")
        for side, domain in (("in", "in_domain"), ("out", "out_of_domain"))
    },
    **{f"underflow_{at}": underflow_mean_tag(at, "test/") for at in ("1x", "4x")},
}


BY_DISTANCE = {  # recall_by_distance.csv column -> EpisodeRecall's tag
    "distance": "distance",
    "exact": "exact",
    "blind_share": "blind",
    "unreachable_share": "unreachable",
    "failed_blind": "failed_blind",
    "failed_reachable": "failed_reachable",
    "baseline": "baseline",  # the most common answer's share: what a constant answer scores
    "constant_answer": "constant_answer",  # 1: one predicted answer for nearly every episode
    "length": "length",  # the longest episode's tokens
    "exact_capped": "exact_capped",  # beyond the window, with every head's bias held at its value at the window
    "exact_zero_free": "exact_zero_free",  # re-scored with the model in float64: no exact zeros
    "exact_floored": "exact_floored",  # re-scored with every bias held at or above a floor
    "zeros": "zeros",  # share of the fact's weights (episodes x layers x heads) exactly 0
    "zeros_zero_free": "zeros_zero_free",  # ... in float64
    "carriers_blind": "carriers_blind",  # every head that carries recall gives the fact exactly 0
    "carriers_near_blind": "carriers_near_blind",  # ... less than attribution.NEAR_BLIND, not all 0
    "carriers_reachable": "carriers_reachable",  # ... some carrier gives it more
}


HEAD_PARTS = ("ablation_cost", "blind_by", "exact_at_blind_by")  # heads.csv's columns, EpisodeRecall's head tags


def run_rows(records: list[dict]) -> pd.DataFrame:
    """One row per run: setup, seed, the summary columns, wall time."""
    rows = []
    for record in records:
        metrics = record.get("metrics", {})
        row = {"setup": record["setup"], "seed": record["seed"], "step": record.get("global_step")}
        row.update({column: _number(metrics.get(tag)) for column, tag in COLUMNS.items()})
        recall = {  # recall_near, recall_far: at the smallest and largest gap
            int(m["gap"]): _number(metrics[m.string])
            for m in at_stage(RECALL, metrics)
            if m["gap"] and m["part"] == "exact"
        }
        row["recall_near"] = recall[min(recall)] if recall else None
        row["recall_far"] = recall[max(recall)] if recall else None
        row["window"] = _window(metrics)
        row["wall_s"] = record.get("wall_s")
        rows.append(row)
    return pd.DataFrame(rows)


def _window(metrics: dict) -> int | None:
    """The training window (tokens), from a recall distance point: its tokens over its multiple of the window."""
    for match in at_stage(RECALL, metrics):
        if match["distance"] and match["part"] == "distance" and float(match["distance"]) > 0:
            return round(float(metrics[match.string]) / float(match["distance"]))
    return None


def per_head_underflow(records: list[dict]) -> pd.DataFrame:
    """Setup x head: the share of causal weights exactly zero at 1x, mean over layers and seeds."""
    rows = []
    for record in records:
        metrics = record.get("metrics", {})
        for match in at_stage(UNDERFLOW, metrics):
            if match["at"] is None and _number(metrics[match.string]) is not None:
                rows.append(
                    {"setup": record["setup"], "head": int(match["head"]), "value": float(metrics[match.string])}
                )
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows).groupby(["setup", "head"])["value"].mean().unstack("head")
    return frame.reindex(list(dict.fromkeys(r["setup"] for r in records if r["setup"] in frame.index)))


def recall_by_distance(records: list[dict]) -> pd.DataFrame:
    """One row per setup, seed and distance measured at test: the window multiple (``factor``), the distance in
    tokens, the training ``window``, exact recall and the blind / reachable split of the failures."""
    rows = []
    for record in records:
        points: dict[float, dict] = {}
        metrics = record.get("metrics", {})
        for match in at_stage(RECALL, metrics):
            if match["distance"] and match["part"] in BY_DISTANCE.values():
                points.setdefault(float(match["distance"]), {})[match["part"]] = _number(metrics[match.string])
        for factor, values in sorted(points.items()):
            row = {"setup": record["setup"], "seed": record["seed"], "factor": factor}
            row.update({column: values.get(tag) for column, tag in BY_DISTANCE.items()})
            row["window"] = round(row["distance"] / factor) if row["distance"] is not None else None
            rows.append(row)
    columns = ["setup", "seed", "factor", "distance", "window", *list(BY_DISTANCE)[1:]]
    return pd.DataFrame(rows, columns=columns)


def head_attribution(records: list[dict]) -> pd.DataFrame:
    """One row per setup, seed, layer and head the run attributed (``EpisodeRecall(attribution=True)``): the recall
    its ablation costs, and for a head that carries recall the distance where its fact weight is exactly 0 in every
    episode (``blind_by``) with the recall there."""
    rows: dict[tuple, dict] = {}
    for record in records:
        metrics = record.get("metrics", {})
        for match in at_stage(RECALL_HEAD, metrics):
            key = (record["setup"], record["seed"], int(match["layer"]), int(match["head"]))
            rows.setdefault(key, dict(zip(("setup", "seed", "layer", "head"), key)))[match["name"]] = _number(
                metrics[match.string]
            )
    return pd.DataFrame(list(rows.values()), columns=["setup", "seed", "layer", "head", *HEAD_PARTS])


def predicted_blind_distances(records: list[dict]) -> dict[str, list[float]]:
    """Setup -> each head's predicted blind distance (materialized softmax) where finite, from its first run."""
    predicted: dict[str, list[float]] = {}
    for record in records:
        metrics = record.get("metrics", {})
        materialized = [m.string for m in at_stage(PREDICTED, metrics) if m["softmax"] == "materialized"]
        values = [float(metrics[tag]) for tag in materialized if _number(metrics[tag])]
        predicted.setdefault(record["setup"], sorted(values))
    return predicted


def by_setup(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and half the min-max range over seeds, per setup, in the runs' order."""
    order = list(dict.fromkeys(runs["setup"]))
    values = runs.drop(columns=["seed", "step"]).groupby("setup", sort=False)
    mean, spread = values.mean(), (values.max() - values.min()) / 2
    table = mean.join(spread.add_suffix("_spread")).reindex(order)
    table.insert(0, "seeds", runs.groupby("setup", sort=False)["seed"].count().reindex(order))
    return table


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
