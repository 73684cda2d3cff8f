"""The grid's figures: retrieval AUC per setup, loss by length, underflow per head, recall by distance, the curves
over training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

TAB20 = [colormaps["tab20"](i) for i in range(20)]  # a colour per line


def plot_curves(path: Path, curves: pd.DataFrame, measured: str) -> None:
    """One panel per point: each setup's ``measured`` over training (mean over seeds, a dot per seed)."""
    points = list(dict.fromkeys(curves["point"]))
    figure = Figure(figsize=(4 * len(points), 3.5))
    for axis, point in zip(figure.subplots(1, len(points), squeeze=False)[0], points):
        axis.set_prop_cycle(color=TAB20)
        for setup, frame in curves[curves["point"] == point].groupby("setup", sort=False):
            mean = frame.groupby("step")["value"].mean()
            (line,) = axis.plot(mean.index, mean.to_numpy(), marker="o", label=setup)
            axis.plot(frame["step"], frame["value"], ".", color=line.get_color(), markersize=3)
        axis.set_title(f"{measured}, {point.replace('distance', 'distance ')}")
        axis.set_xlabel("step")
        axis.set_ylim(0, 1.02)
    figure.axes[0].set_ylabel(measured)
    figure.axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot_recall_by_distance(out: Path, table: pd.DataFrame, predicted: dict[str, list[float]]) -> None:
    """A panel per setup: exact recall against distance (a line for the mean, a dot per seed), the share of episodes
    whose fact was blind (dashed), the training window (shaded) and each head's predicted blind distance (ticks)."""
    setups = list(dict.fromkeys(table["setup"]))
    columns = min(4, len(setups))
    rows = -(-len(setups) // columns)
    figure = Figure(figsize=(3.2 * columns, 2.6 * rows))
    axes = figure.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    low, high = table["distance"].min(), table["distance"].max()
    for axis, setup in zip(axes.flat, setups):
        frame = table[table["setup"] == setup]
        mean = frame.groupby("distance")[["exact", "blind_share"]].mean()
        axis.axvspan(low / 1.2, frame["window"].iloc[0], color="0.92", zorder=0)
        for distance in predicted.get(setup, []):
            if low / 1.2 <= distance <= high * 1.2:
                axis.axvline(distance, color="tab:red", linewidth=0.8, linestyle=":")
        axis.plot(frame["distance"], frame["exact"], ".", color="tab:blue", markersize=4, alpha=0.6)
        axis.plot(mean.index, mean["exact"], "-o", color="tab:blue", markersize=3, label="exact recall")
        axis.plot(mean.index, mean["blind_share"], "--", color="tab:red", label="fact blind")
        axis.set_title(setup, fontsize="medium")
        axis.set_xscale("log", base=2)
        distances = sorted(table["distance"].unique())
        axis.set_xticks(distances, [f"{d:.0f}" for d in distances], fontsize="x-small")
        axis.minorticks_off()
        axis.set_xlim(low / 1.2, high * 1.2)
        axis.set_ylim(-0.03, 1.03)
    for axis in axes.flat[len(setups) :]:
        axis.set_visible(False)
    for axis in axes.flat[max(0, len(setups) - columns) : len(setups)]:  # the lowest panel of each column
        axis.tick_params(labelbottom=True)
        axis.set_xlabel("answer distance (tokens)")
    for axis in axes[:, 0]:
        axis.set_ylabel("share of episodes")
    axes[0, 0].legend(fontsize="x-small", loc="lower left")
    figure.suptitle("held-out recall by distance (shaded: the training window; dotted: predicted blind distances)")
    figure.tight_layout()
    figure.savefig(out / "recall_by_distance.png", dpi=120)


def figures(out: Path, runs: pd.DataFrame, heads: pd.DataFrame) -> None:
    order = list(dict.fromkeys(runs["setup"]))
    auc = runs[[f"{task}_auc_{domain}" for task in ("passkey", "needle") for domain in ("in", "out")]]
    if auc.fillna(0).to_numpy().any():  # an all-zero figure says nothing: summary.md holds the zeros
        _plot_auc(out, runs, order)
    _plot_loss_by_length(out, runs, order)
    if not heads.empty:
        _plot_heads(out, heads)


def _plot_auc(out: Path, runs: pd.DataFrame, order: list[str]) -> None:
    x = np.arange(len(order))
    figure = Figure(figsize=(max(8, 0.7 * len(order)), 6))
    for axis, task in zip(figure.subplots(2, 1, sharex=True), ("passkey", "needle")):
        for offset, domain in ((-0.2, "in"), (0.2, "out")):
            column = f"{task}_auc_{domain}"
            means = runs.groupby("setup", sort=False)[column].mean().reindex(order)
            axis.bar(x + offset, means, width=0.4, label=f"{'in' if domain == 'in' else 'beyond'} the training length")
            for i, setup in enumerate(order):
                seeds = runs.loc[runs["setup"] == setup, column]
                axis.plot([i + offset] * len(seeds), seeds, "k.", markersize=4)
        axis.set_ylabel(f"{task} AUC")
        axis.set_ylim(0, 1)
    axis.set_xticks(x, order, rotation=45, ha="right")
    figure.axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(out / "retrieval_auc.png", dpi=120)


def _plot_loss_by_length(out: Path, runs: pd.DataFrame, order: list[str]) -> None:
    """Held-out loss against evaluation length, a line per setup; setups whose curves agree to 0.005 nats share
    one line, labelled with all their names (they would hide each other)."""
    factors = [f for f in (1, 2, 4, 8) if runs[f"loss_{f}x"].notna().any()]
    means = runs.groupby("setup", sort=False)[[f"loss_{f}x" for f in factors]].mean().reindex(order)
    groups: list[list[str]] = []
    for setup in order:
        same = next((g for g in groups if (means.loc[g[0]] - means.loc[setup]).abs().max() < 0.005), None)
        if same is None:
            groups.append([setup])
        else:
            same.append(setup)
    figure = Figure(figsize=(7, 4))
    axis = figure.subplots()
    axis.set_prop_cycle(color=TAB20)  # a colour per line
    for group in groups:
        axis.plot(factors, means.loc[group[0]].to_numpy(), marker="o", label=" = ".join(group))
    axis.set_xscale("log", base=2)
    axis.set_xticks(factors, [f"{f}x" for f in factors])
    axis.minorticks_off()
    axis.set_xlabel("evaluation length / training length")
    axis.set_ylabel("held-out loss")
    axis.legend(fontsize="x-small", ncol=2)
    figure.tight_layout()
    figure.savefig(out / "loss_by_length.png", dpi=120)


def _plot_heads(out: Path, heads: pd.DataFrame) -> None:
    figure = Figure(figsize=(1.5 + 0.5 * heads.shape[1], 1.0 + 0.35 * heads.shape[0]))
    axis = figure.subplots()
    image = axis.imshow(heads.to_numpy(), vmin=0, vmax=max(1e-3, float(np.nanmax(heads.to_numpy()))), cmap="magma")
    axis.set_xticks(range(heads.shape[1]), [str(h) for h in heads.columns])
    axis.set_yticks(range(heads.shape[0]), list(heads.index))
    axis.set_xlabel("head")
    axis.set_title("weights exactly zero at 1x\n(share of causal pairs, mean over layers and seeds)")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    figure.savefig(out / "underflow_per_head.png", dpi=120)
