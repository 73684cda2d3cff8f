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


def zero_share_heatmap(
    layers: list[ZeroStatistics], title: str = "share of causal attention weights exactly zero", deaf: bool = False
):
    """Layer x head heatmap of the share of causal weights that are exactly zero (``deaf``: past the learning
    horizon, below e^-H of their row's largest)."""
    shares = np.stack([(s.deaf_share if deaf else s.zero_share).numpy() for s in layers])
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
    figure, axis = _figure(9, 4)
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
    columns = 1 if len(handles) <= 12 else 2
    axis.legend(handles=handles, fontsize="small", ncol=columns, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside
    figure.tight_layout()
    return figure


PREDICTIONS = {  # softmax -> label and style of its predicted blind distances
    "materialized": ("predicted, materialized softmax (eager, SDPA: as measured)", {"color": "C1", "marker": "x"}),
    "fused": ("predicted, fused softmax (FlexAttention)", {"color": "C2", "marker": "+", "linestyle": "--"}),
}


def blind_distance_figure(measured: torch.Tensor, predicted: dict[str, torch.Tensor], longest: int, title: str = ""):
    """Each head's blind distance (tokens, log axis): ``measured`` (layers, heads) in each layer's eager weights, one
    dot per layer, ``inf`` where the layer is not blind within the ``longest`` length measured (drawn as a triangle at
    that length, which is marked); beside it a line per softmax of ``predicted`` (heads) from the bias alone
    (``PREDICTIONS``; infinite predictions, no bias, are left out)."""
    figure, axis = _figure(7, 4)
    layers, heads = measured.shape
    spread = np.linspace(-0.15, 0.15, layers) if layers > 1 else np.zeros(1)  # the layers side by side
    finite = torch.isfinite(measured)
    beyond = f"not blind within {longest} tokens (each layer)"
    for label, blind, marker in (("measured in eager weights (each layer)", True, "o"), (beyond, False, "^")):
        cells = (finite == blind).nonzero().tolist()  # (layer, head) pairs
        if cells:
            xs = [head + spread[layer] for layer, head in cells]
            ys = [measured[layer, head].item() if blind else longest for layer, head in cells]
            axis.plot(xs, ys, linestyle="", color="C0", marker=marker, fillstyle="full" if blind else "none",
                      label=label)  # fmt: skip
    for softmax, values in predicted.items():
        label, style = PREDICTIONS[softmax]
        shown = [(head, value) for head, value in enumerate(values.tolist()) if math.isfinite(value)]
        if shown:
            axis.plot(*zip(*shown), label=label, **style)
    axis.axhline(longest, color="black", linewidth=1)
    axis.annotate(f" longest length measured ({longest})", (-0.4, longest), fontsize="small", va="bottom")
    axis.set_yscale("log", base=2)
    axis.set_xticks(range(heads))
    axis.set_xlabel("head")
    axis.set_ylabel("blind distance (tokens)")
    axis.set_title(title)
    axis.legend(fontsize="small", loc="upper left")
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
