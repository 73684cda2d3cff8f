"""What a grid run measured during training, read from its TensorBoard logs into its record: held-out recall per point
and passkey and needle AUC over the steps."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from blindheads.analysis.runs import scalars
from blindheads.evaluation.tags import (
    RECALL,
    retrieval_tag,
)

RETRIEVAL_POINTS = {  # passkey and needle measured during training (no stage): tag -> point
    retrieval_tag(task, f"auc_{domain}"): f"{task} {side}"
    for task in ("passkey", "needle")
    for side, domain in (("in", "in_domain"), ("out", "out_of_domain"))
}


def recall_points(frame: pd.DataFrame) -> pd.Series:
    """Held-out recall measured during training (``EpisodeRecall(every_n_steps=N)``), per point (``gap8``,
    ``distance2x``); NaN for every other tag."""
    parts = frame["tag"].str.extract(RECALL)
    keep = parts["stage"].isna() & parts["part"].eq("exact") & (parts["gap"].notna() | parts["distance"].notna())
    return parts["point"].where(keep)


def retrieval_points(frame: pd.DataFrame) -> pd.Series:
    """Passkey and needle AUC measured during training (``passkey in``, ``needle out``); NaN for every other tag."""
    return frame["tag"].map(RETRIEVAL_POINTS)


CURVES = {"recall": (recall_points, "held-out recall"), "retrieval": (retrieval_points, "AUC (exact)")}


def measured_during_training(run_dir: Path) -> dict:
    """What a grid run measured during training (recall per point, passkey and needle AUC), for its record: the
    committed records then carry their curves to a summary made on any checkout, without the runs' logs.
    ``{"curves": {"retrieval": {"point": [...], "step": [...], "value": [...]}}}``; empty where it measured none."""
    frame = scalars(run_dir)
    curves = {}
    for name, (points, _) in CURVES.items():
        point = points(frame)
        kept = frame[point.notna()]
        if len(kept):
            curves[name] = {"point": point.dropna().tolist(), "step": kept["step"].tolist(),
                            "value": kept["value"].tolist()}  # fmt: skip
    return {"curves": curves} if curves else {}


def curves_over_training(records: list[dict], name: str, runs_dir: Path | None = None) -> pd.DataFrame:
    """The ``name`` curves of every run (setup, seed, point, step, value) from its record, or, for a record made
    before records kept them, from its logs under ``runs_dir``; empty when no run has them."""
    frames = []
    for record in records:
        kept = record.get("curves")
        if kept is None and runs_dir is not None:
            kept = measured_during_training(runs_dir / record["setup"] / f"seed{record['seed']}").get("curves")
        if kept and name in kept:
            frames.append(pd.DataFrame({"setup": record["setup"], "seed": record["seed"], **kept[name]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
