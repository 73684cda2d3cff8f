"""The grid's summary: one row per setup (mean and spread over seeds), in CSV and Markdown, three figures, and a
``results.json`` that records every run with the command, versions and wall time."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from blindheads.analysis.runs import scalars
from blindheads.evaluation.attribution import CARRIES
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
from blindheads.experiments.comparisons import REFERENCE, regime_row, write_comparisons
from blindheads.experiments.findings import write_findings
from blindheads.experiments.losses import write_losses
from blindheads.experiments.retrieval_comparisons import write_retrieval
from blindheads.experiments.runner import provenance, write_json

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

TAB20 = [colormaps["tab20"](i) for i in range(20)]  # a colour per line
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


def predicted_blind_distances(records: list[dict]) -> dict[str, list[float]]:
    """Setup -> each head's predicted blind distance (materialized softmax) where finite, from its first run."""
    predicted: dict[str, list[float]] = {}
    for record in records:
        metrics = record.get("metrics", {})
        materialized = [m.string for m in at_stage(PREDICTED, metrics) if m["softmax"] == "materialized"]
        values = [float(metrics[tag]) for tag in materialized if _number(metrics[tag])]
        predicted.setdefault(record["setup"], sorted(values))
    return predicted


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


def by_setup(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and half the min-max range over seeds, per setup, in the runs' order."""
    order = list(dict.fromkeys(runs["setup"]))
    values = runs.drop(columns=["seed", "step"]).groupby("setup", sort=False)
    mean, spread = values.mean(), (values.max() - values.min()) / 2
    table = mean.join(spread.add_suffix("_spread")).reindex(order)
    table.insert(0, "seeds", runs.groupby("setup", sort=False)["seed"].count().reindex(order))
    return table


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


def write_tables(out: Path, records: list[dict], runs_dir: Path | None = None) -> pd.DataFrame:
    """The summary's tables, figures, comparisons and findings from the runs' records (``results.json`` is
    ``write_summary``'s); with no records, a ``summary.md`` that says no run is done."""
    out.mkdir(parents=True, exist_ok=True)
    if not records:  # a part (--hours) too short for any run: a summary that says so, no tables of nothing
        (out / "summary.md").write_text("No run is done yet.\n")
        return pd.DataFrame()
    runs = run_rows(records)
    table = by_setup(runs)
    heads = per_head_underflow(records)
    runs.to_csv(out / "runs.csv", index=False)
    write_retrieval(out, runs)  # where the runs measured passkey and needle: paired against ALiBi, beside the paper
    table.to_csv(out / "summary.csv")
    (out / "summary.md").write_text(markdown(table))
    if not heads.empty:
        heads.to_csv(out / "underflow_per_head.csv")
    figures(out, runs, heads)
    losses = write_losses(out, records)  # held-out natural-text loss by length and position, against ALiBi
    distances = recall_by_distance(records)
    first_blind = predicted_blind_distances(records).get(REFERENCE)
    regime = regime_row(distances, min(first_blind)) if first_blind and not distances.empty else None
    # where the runs measured recall per point: paired differences, and the paper's regime where heads go blind in it
    compared = write_comparisons(out, records, extra=[regime] if regime else [])
    if not distances.empty:
        distances.to_csv(out / "recall_by_distance.csv", index=False)
        (out / "recall_by_distance.md").write_text(distance_markdown(distances))
        plot_recall_by_distance(out, distances, predicted_blind_distances(records))
        attributed = head_attribution(records)
        if not attributed.empty:
            attributed.to_csv(out / "heads.csv", index=False)
            (out / "attribution.md").write_text(attribution_markdown(distances, attributed, CARRIES))
        if compared is not None:
            write_findings(out, *compared, distances, attributed, losses)
    for name, (_, measured) in CURVES.items():
        curves = curves_over_training(records, name, runs_dir)
        if not curves.empty:
            curves.to_csv(out / f"{name}_curves.csv", index=False)
            plot_curves(out / f"{name}_over_training.png", curves, measured)
            without = [f"{r['setup']} seed {r['seed']}" for r in records
                       if not ((curves["setup"] == r["setup"]) & (curves["seed"] == r["seed"])).any()]  # fmt: skip
            if without:
                with (out / "summary.md").open("a") as summary:
                    summary.write(f"\n{name}_curves.csv: no curves for {', '.join(without)} (their records "
                                  "keep none and their logs are not under --runs).\n")  # fmt: skip
    return table


def write_summary(
    out: Path,
    records: list[dict],
    command: str,
    wall_s: float,
    runs_dir: Path | None = None,
    remaining: list[str] | None = None,
) -> pd.DataFrame:
    """``write_tables``, then ``results.json``: every run's record with the command, versions and wall time, and
    the runs of the experiment not done yet (``remaining``)."""
    table = write_tables(out, records, runs_dir)
    span = _span_s(runs_dir) if runs_dir is not None else None
    record = {
        **provenance(command, wall_s, [r["seed"] for r in records]),
        "runs_wall_s": round(sum(r.get("wall_s") or 0 for r in records), 1),  # every run, fit and test
        "span_s": span,  # from the first run's first log to the last results file: the grid's wall time
        "remaining": remaining or [],
    }
    write_json(out / "results.json", {**record, "runs": records})
    return table


def _span_s(runs: Path) -> float | None:
    """Seconds from the earliest TensorBoard event file's creation (its name holds the time) to the newest
    ``results.json``: the grid's wall time, read from what it wrote, across resumed invocations."""
    starts = [int(p.name.split(".")[3]) for p in runs.rglob("events.out.tfevents.*")]
    ends = [p.stat().st_mtime for p in runs.rglob("results.json")]
    return round(max(ends) - min(starts), 1) if starts and ends else None


def _share(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.2f}"


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
