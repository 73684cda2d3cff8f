"""The grid's Markdown tables: the summary per setup, recall by distance, and the heads that carry recall."""

from __future__ import annotations

import math

import pandas as pd

INTERVENED = {"exact_capped": "capped", "exact_zero_free": "zero-free", "exact_floored": "floored"}


def attribution_markdown(distances: pd.DataFrame, heads: pd.DataFrame, carries: float) -> str:
    """Per setup: the heads that carry recall (ablation costs at least ``carries``) in how many seeds, and at each
    point re-scored under an intervention, exact recall, then recall with the bias capped beyond the window, without
    exact zeros, with the bias floored, and the carriers' blind / near-blind shares (means over seeds)."""
    kinds = [c for c in INTERVENED if c in distances and distances[c].notna().any()]
    factors = sorted(distances.loc[distances[kinds].notna().any(axis=1), "factor"].unique()) if kinds else []
    lines = [
        f"Heads that carry in-window recall (ablating one at the answer's query costs at least {carries:.0%} of it; "
        "l{layer}h{head}: seeds), and per point exact recall -> recall re-scored "
        f"({' / '.join(INTERVENED[k] for k in kinds)}: every head's bias beyond the window held at its value at the "
        "window's edge / the model in float64, no exact zeros / every bias held at or above the floor) [carriers "
        "blind / near-blind], means over seeds:",
        "",
        "| setup | seeds | carriers | " + " | ".join(f"{f:g}x" for f in factors) + " |",
        "|---" * (len(factors) + 3) + "|",
    ]
    for setup, frame in distances.groupby("setup", sort=False):
        carriers = heads[(heads["setup"] == setup) & (heads["ablation_cost"] >= carries)]
        counts = carriers.groupby(["layer", "head"]).size().sort_values(ascending=False)
        named = ", ".join(f"l{layer}h{head}: {n}" for (layer, head), n in counts.items()) or "none"
        cells = []
        for factor in factors:
            at = frame[frame["factor"] == factor].mean(numeric_only=True)
            shares = (
                f"{_share(at.get('carriers_blind'))} / {_share(at.get('carriers_near_blind'))}"  # absent: no carrier
            )
            again = " / ".join(_share(at.get(k)) for k in kinds)
            cells.append(f"{at['exact']:.2f} -> {again} [{shares}]")
        lines.append(f"| {setup} | {frame['seed'].nunique()} | {named} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def distance_markdown(table: pd.DataFrame) -> str:
    """Setup x distance: exact recall and, beside it, the share of episodes whose fact was blind (mean ± half the
    range over seeds), marked where a seed answered one constant; each column names its episodes' length and
    whether they fit the training window, and a last row gives the best constant answer's score."""
    factors = sorted(table["factor"].unique())
    window = int(table["window"].iloc[0])
    head = " | ".join(_distance_column(f, window, table[table["factor"] == f]["length"].max()) for f in factors)
    lines = [
        f"Exact recall (blind share) by answer distance, as a multiple of the {window}-token window (tokens):",
        "",
        f"| setup | seeds | {head} |",
        "|---" * (len(factors) + 2) + "|",
    ]
    for setup, frame in table.groupby("setup", sort=False):
        cells = []
        for factor in factors:
            at = frame[frame["factor"] == factor]
            exact, blind, constant = at["exact"], at["blind_share"], (at["constant_answer"] == 1).sum()
            spread = (exact.max() - exact.min()) / 2
            mark = f" [one answer: {constant}/{len(at)} seeds]" if constant else ""
            cells.append(f"{exact.mean():.2f} ± {spread:.2f} ({blind.mean():.2f}){mark}")
        lines.append(f"| {setup} | {frame['seed'].nunique()} | " + " | ".join(cells) + " |")
    if table["baseline"].notna().any():
        baselines = [table[table["factor"] == f]["baseline"].mean() for f in factors]
        lines.append("| best constant answer | | " + " | ".join(f"{b:.2f}" for b in baselines) + " |")
    return "\n".join(lines) + "\n"


def _distance_column(factor: float, window: int, length: float) -> str:
    """``1x (64)``; with the episodes' length known, ``1x (64; 78-token episodes, beyond the window)``."""
    if pd.isna(length):
        return f"{factor:g}x ({round(factor * window)})"
    where = "in" if length <= window else "beyond"
    return f"{factor:g}x ({round(factor * window)}; {length:.0f}-token episodes, {where} the window)"


def markdown(table: pd.DataFrame) -> str:
    """Each column as ``mean ± spread`` (spread: half the range over seeds); columns no run measured are left out."""
    columns = [c for c in table.columns if not c.endswith("_spread") and c != "seeds" and table[c].notna().any()]
    lines = ["| setup | seeds | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for setup, row in table.iterrows():
        cells = []
        for column in columns:
            value, spread = row[column], row.get(f"{column}_spread", math.nan)
            digits = 0 if column == "wall_s" else 3
            cells.append("n/a" if pd.isna(value) else f"{value:.{digits}f} ± {spread:.{digits}f}")
        lines.append(f"| {setup} | {int(row['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _share(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.2f}"
