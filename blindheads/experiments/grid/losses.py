"""Held-out loss on natural text, setup against ALiBi seed by seed: by length (1x, 2x... the training window) and,
where the runs measured it, by position inside the window. What standard benchmarks stand for at a scale too small to
run them (the paper's finding 5): does a position setup cost language modelling?

A run's test logs the held-out loss (text without retrieval episodes) at each length (``extrapolation/{f}x/loss``)
and, with ``LengthExtrapolation(position_bucket=...)``, per bucket of positions (``extrapolation/1x/at{start}``). Each
setup is compared with ``REFERENCE`` per point: the mean of the per-seed differences (setup - reference, in nats: a
positive difference is a higher loss, worse), its Student-t interval over seeds (the losses are means over thousands
of tokens; the seeds' spread is the noise), wins and losses, and the paired t p-value Holm-adjusted within the pair
(``family``: one setup against the reference, over every point).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from blindheads.evaluation.tags import EXTRAPOLATION, at_stage
from blindheads.experiments.grid.comparisons import REFERENCE, holm, paired_t

MINOR = 0.02  # nats: a setup whose held-out loss is within this of the reference's (interval and all) costs little


def per_seed_losses(records: list[dict]) -> pd.DataFrame:
    """One row per setup, seed and point: ``point`` ``1x`` (the whole window's loss at that length) or ``1x@32``
    (positions 32.. of the next bucket, at that length), ``position`` the bucket's first position (NaN for a
    length), and the loss."""
    rows = []
    for record in records:
        metrics = record.get("metrics", {})
        for match in at_stage(EXTRAPOLATION, metrics):
            part = match["part"]
            if part == "loss" or part.startswith("at"):
                position = float(part.removeprefix("at")) if part != "loss" else np.nan
                point = f"{match['factor']}x" + ("" if part == "loss" else f"@{part.removeprefix('at')}")
                rows.append({"setup": record["setup"], "seed": record["seed"], "point": point,
                             "factor": int(match["factor"]), "position": position,
                             "loss": float(metrics[match.string])})  # fmt: skip
    columns = ["setup", "seed", "point", "factor", "position", "loss"]
    table = pd.DataFrame(rows, columns=columns)
    return table.sort_values(["factor", "position"], na_position="first", kind="stable").reset_index(drop=True)


def compare_losses(table: pd.DataFrame, reference: str = REFERENCE) -> pd.DataFrame:
    """Each setup against ``reference`` at every point both measured, over their common seeds."""
    rows = []
    for point, at in table.groupby("point", sort=False):
        by_seed = at.pivot(index="seed", columns="setup", values="loss")
        if reference not in by_seed:
            continue
        for setup in by_seed.columns:
            if setup == reference:
                continue
            both = by_seed[[setup, reference]].dropna()
            rows.append({"setup_a": setup, "setup_b": reference, "point": point,
                         **paired_t((both[setup] - both[reference]).to_numpy()),
                         "family": f"{setup} - {reference}"})  # fmt: skip
    compared = pd.DataFrame(rows)
    if not compared.empty:
        compared["p_holm"] = holm(compared["p_t"], compared["family"])
    return compared


def minor(row: pd.Series) -> bool:
    """The interval lies within ``MINOR`` nats of 0: the setup's loss is the reference's, give or take little."""
    return bool(row["seeds"] > 1 and row["ci_low"] >= -MINOR and row["ci_high"] <= MINOR)


def losses_markdown(compared: pd.DataFrame) -> str:
    points = list(dict.fromkeys(compared["point"]))
    lines = [
        "Held-out loss on natural text (nats), setup - reference per seed: mean [95% t-interval] wins/ties/losses "
        "(a win is a higher loss); points: `Nx` the whole sequence at N windows, `1x@P` positions P.. of the next "
        f"bucket inside the window. **Bold**: Holm-adjusted t p below 0.05 (family: the pair). *Italic*: within "
        f"+-{MINOR} nats, interval and all.",
        "",
        "| setup - reference | " + " | ".join(points) + " |",
        "|---" * (len(points) + 1) + "|",
    ]
    for (a, b), pair in compared.groupby(["setup_a", "setup_b"], sort=False):
        cells = dict.fromkeys(points, "")
        for _, row in pair.iterrows():
            interval = f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]" if row["seeds"] > 1 else "[one seed]"
            cell = f"{row['mean_diff']:+.3f} {interval} {row['wins']}/{row['ties']}/{row['losses']}"
            cell = f"**{cell}**" if row["p_holm"] < 0.05 else cell
            cells[row["point"]] = f"*{cell}*" if minor(row) else cell
        lines.append(f"| {a} - {b} | " + " | ".join(cells.values()) + " |")
    return "\n".join(lines) + "\n"


def write_losses(out: Path, records: list[dict], reference: str = REFERENCE) -> pd.DataFrame | None:
    """``losses.csv`` and ``losses.md`` where the runs measured held-out loss and ran ``reference``; else None."""
    table = per_seed_losses(records)
    compared = compare_losses(table, reference) if not table.empty else pd.DataFrame()
    if compared.empty:
        return None
    compared.to_csv(out / "losses.csv", index=False)
    (out / "losses.md").write_text(losses_markdown(compared))
    return compared
