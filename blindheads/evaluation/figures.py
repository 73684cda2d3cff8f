"""Figures of measured attention underflow, for TensorBoard, probe outputs and notebooks.

Built as ``matplotlib.figure.Figure`` objects, without pyplot: no backend is chosen and no global figure is kept
(importing this package leaves a Jupyter user's backend alone, and long runs do not collect open figures).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.figure import Figure

from blindheads.evaluation.sweep import SweepScores
from blindheads.evaluation.underflow import ZeroStatistics, mean_zero_share_by_distance


def _figure(width: float, height: float):
    figure = Figure(figsize=(width, height))
    return figure, figure.subplots()


def zero_share_heatmap(layers: list[ZeroStatistics], title: str = "share of causal attention weights exactly zero"):
    """Layer x head heatmap of the share of causal weights that are exactly zero."""
    shares = np.stack([s.zero_share.numpy() for s in layers])
    figure, axis = _figure(1.5 + 0.5 * shares.shape[1], 1.0 + 0.3 * shares.shape[0])
    image = axis.imshow(shares, vmin=0, vmax=1, cmap="magma", aspect="auto")
    axis.set_xlabel("head")
    axis.set_ylabel("layer")
    axis.set_title(title)
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    return figure


def zero_share_by_distance(
    layers: list[ZeroStatistics],
    predicted: torch.Tensor,
    predicted_subnormal: torch.Tensor | None = None,
    title: str = "",
):
    """Underflow share against distance per head (mean over layers); dotted lines mark each head's predicted
    blindness distance (``normal`` threshold), dashed ones the ``subnormal`` prediction when given."""
    share = mean_zero_share_by_distance(layers).numpy()
    figure, axis = _figure(7, 4)
    lines = []
    for head, row in enumerate(share):
        (line,) = axis.plot(row, label=f"head {head}")
        lines.append(line)
        for values, style in ((predicted, ":"), (predicted_subnormal, "--")):
            if values is not None and math.isfinite(values[head]) and values[head] < len(row):
                axis.axvline(float(values[head]), color=line.get_color(), linestyle=style, linewidth=1)
    axis.set_xlabel("distance to key (tokens)")
    axis.set_ylabel("share of weights exactly zero")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title(title)
    handles = lines if len(lines) <= 16 else []  # the heads, where a legend can hold them
    for values, style, label in (
        (predicted, ":", "predicted, normal threshold (subnormals flushed)"),
        (predicted_subnormal, "--", "predicted, subnormal threshold (subnormals kept)"),
    ):
        if values is not None:
            (proxy,) = axis.plot([], [], color="grey", linestyle=style, linewidth=1, label=label)
            handles.append(proxy)
    axis.legend(handles=handles, fontsize="small", ncol=2)
    figure.tight_layout()
    return figure


RECALL_SERIES = {  # part -> label and style: told apart by line style and marker, not by colour alone
    "exact": ("exact recall", {"color": "C0", "marker": "o", "linestyle": "-"}),
    "exact_zero_free": ("no exact zeros (float64)", {"color": "C1", "marker": "s", "linestyle": "--"}),
    "exact_floored": ("bias floored", {"color": "C2", "marker": "^", "linestyle": "-."}),
    "exact_capped": ("bias capped", {"color": "C3", "marker": "v", "linestyle": ":"}),
    "baseline": ("best constant answer", {"color": "0.5", "marker": "", "linestyle": "--"}),
}


def recall_by_distance_figure(points: dict[float, dict[str, float]], window: int, title: str = ""):
    """Recall against answer distance (log axis), one line per measure a point has (``RECALL_SERIES``), the
    training window marked: ``points`` maps each point's mean distance in tokens to its scalars by part."""
    figure, axis = _figure(7, 4)
    distances = sorted(points)
    for part, (label, style) in RECALL_SERIES.items():
        xs = [d for d in distances if part in points[d]]
        if xs:
            axis.plot(xs, [points[d][part] for d in xs], label=label, **style)
    axis.axvline(window, color="black", linewidth=1)
    axis.annotate(f" window ({window})", (window, 1.0), fontsize="small", va="top")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("answer distance (tokens back to the fact)")
    axis.set_ylabel("share answered exactly")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title(title)
    axis.legend(fontsize="small", loc="lower left")
    figure.tight_layout()
    return figure


def sweep_heatmap(sweep: SweepScores, title: str):
    """Retrieval accuracy, depth (rows) x length (columns); in-domain columns left of the dashed line."""
    figure, axis = _figure(1.2 + 0.7 * len(sweep.lengths), 1.0 + 0.45 * len(sweep.depths))
    image = axis.imshow(sweep.exact.T, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    axis.set_xticks(range(len(sweep.lengths)), [str(n) for n in sweep.lengths], rotation=45)
    axis.set_yticks(range(len(sweep.depths)), [f"{d:.0%}" for d in sweep.depths])
    inside = sum(n <= sweep.training_length for n in sweep.lengths)
    if 0 < inside < len(sweep.lengths):
        axis.axvline(inside - 0.5, color="white", linestyle="--")
    axis.set_xlabel("context length (tokens)")
    axis.set_ylabel("needle depth")
    axis.set_title(title)
    figure.colorbar(image, ax=axis, label="exact match")
    figure.tight_layout()
    return figure
