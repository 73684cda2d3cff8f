"""The grid's summary, published whole: its tables (``tables``) in CSV and Markdown (``reports``), figures
(``figures``), comparisons and findings, and a ``results.json`` that records every run with the command, versions
and wall time."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from blindheads.evaluation.attribution import CARRIES
from blindheads.experiments.driver.records import provenance, write_json
from blindheads.experiments.grid.comparisons import REFERENCE, regime_row, write_comparisons
from blindheads.experiments.grid.curves import CURVES, curves_over_training
from blindheads.experiments.grid.figures import figures, plot_curves, plot_recall_by_distance
from blindheads.experiments.grid.findings import write_findings
from blindheads.experiments.grid.learning_horizon import CONTROL, TREATMENT, judge
from blindheads.experiments.grid.learning_horizon import markdown as horizon_markdown
from blindheads.experiments.grid.losses import write_losses
from blindheads.experiments.grid.reports import attribution_markdown, distance_markdown, markdown
from blindheads.experiments.grid.retrieval_comparisons import write_retrieval
from blindheads.experiments.grid.tables import (
    by_setup,
    head_attribution,
    per_head_underflow,
    predicted_blind_distances,
    recall_by_distance,
    run_rows,
)


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
        if compared is not None and {CONTROL, TREATMENT} <= set(distances["setup"]):  # deaf before blind
            (out / "learning_horizon.md").write_text(horizon_markdown(judge(compared[0], distances, records)))
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
