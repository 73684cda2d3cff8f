"""Passkey and needle AUCs of a grid's setups, seed by seed, against ALiBi and beside the paper's figures.

Each run's test reports four AUCs (exact answers over the tested lengths and depths, in and beyond the training
length). A setup is compared with ALiBi seed by seed (a seed fixes initialisation and data order): the mean of the
per-seed differences, its 95% Student-t interval over seeds (the AUCs are already means over many prompts; the seeds'
spread is the noise), the wins and losses, the exact sign-flip p-value, the paired t p-value Holm-adjusted within the
setup's four AUCs (``p_holm``), and the verdict rule of ``comparisons.py``: ``higher`` (``lower``) where the interval
lies above (below) 0, the setup wins (loses) in more than half the seeds and ``p_holm`` is below 0.05, and no verdict
from fewer than ``MIN_SEEDS`` paired seeds (two seeds give the interval one degree of freedom: two equal differences
would make it a point).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from blindheads.experiments.grid.comparisons import HOLM, NO_DIFFERENCE, REFERENCE, holm, paired_t

MIN_SEEDS = 3
METRICS = ("passkey_auc_in", "passkey_auc_out", "needle_auc_in", "needle_auc_out")
# The paper's figures (arXiv:2608.03994, 148M models at 2,048 tokens) for the setups it reports them for
PAPER = {
    ("alibi", "passkey_auc_out"): 0.08,
    ("log_distance", "passkey_auc_out"): 0.77,
    ("clamp_log_distance", "passkey_auc_out"): 0.79,
    ("alibi", "needle_auc_out"): 0.20,
    ("log_distance", "needle_auc_out"): 0.03,
    ("safe", "needle_auc_out"): 0.02,
    ("alibi", "needle_auc_in"): 0.68,
    ("safe", "needle_auc_in"): 0.48,
}


def paired(runs: pd.DataFrame, reference: str = REFERENCE) -> pd.DataFrame:
    """Per setup other than ``reference`` and metric: seeds, means, the paired difference with its interval,
    wins/losses, p-value, verdict; and each setup's own mean beside the paper's figure."""
    rows = []
    ref = runs[runs["setup"] == reference].set_index("seed")
    for setup, frame in runs.groupby("setup", sort=False):
        mine = frame.set_index("seed")
        for metric in METRICS:
            row = {"setup": setup, "metric": metric, "seeds": int(mine[metric].notna().sum()),
                   "mean": mine[metric].mean(), "paper": PAPER.get((setup, metric))}  # fmt: skip
            if setup != reference and not ref.empty:
                both = mine[[metric]].join(ref[[metric]].add_suffix("_ref"), how="inner").dropna()
                difference = (both[metric] - both[f"{metric}_ref"]).to_numpy()
                row.update(_difference(difference))
            rows.append(row)
    return _verdicts(pd.DataFrame(rows).reindex(columns=COLUMNS))  # a grid of ALiBi alone: its difference columns NaN


COLUMNS = ["setup", "metric", "seeds", "mean", "paper", "paired_seeds", f"minus_{REFERENCE}", "low", "high", "wins",
           "losses", "p", "p_t"]  # fmt: skip


def _difference(difference: np.ndarray) -> dict:
    row = paired_t(difference)
    return {"paired_seeds": row["seeds"], f"minus_{REFERENCE}": row["mean_diff"], "low": row["ci_low"],
            "high": row["ci_high"], "wins": row["wins"], "losses": row["losses"], "p": row["p_sign_flip"],
            "p_t": row["p_t"]}  # fmt: skip


def _verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """``p_holm`` (family: one setup's four AUCs against the reference) and each row's verdict."""
    table = table.copy()
    table["p_holm"] = holm(table["p_t"], table["setup"])
    n, significant = table["paired_seeds"], table["p_holm"] < HOLM
    higher = (table["low"] > 0) & (table["wins"] > n / 2) & significant & (n >= MIN_SEEDS)
    lower = (table["high"] < 0) & (table["losses"] > n / 2) & significant & (n >= MIN_SEEDS)
    few = n.notna() & (n < MIN_SEEDS)
    table["verdict"] = np.select(
        [few, higher, lower], [n.map(lambda k: f"none: {k:.0f} of {MIN_SEEDS} seeds"), "higher", "lower"], NO_DIFFERENCE
    )
    table.loc[n.isna(), "verdict"] = np.nan
    return table


def write_retrieval(out: Path, runs: pd.DataFrame) -> pd.DataFrame | None:
    """``retrieval.csv`` and ``retrieval.md`` where the runs measured passkey and needle AUCs; else None."""
    if not set(METRICS) <= set(runs.columns) or runs[list(METRICS)].isna().all().all():
        return None
    table = paired(runs)
    table.to_csv(out / "retrieval.csv", index=False)
    lines = [
        f"| setup | metric | seeds | mean | paper | minus {REFERENCE} [95% interval] | wins/losses | p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table.itertuples(index=False):
        d = row._asdict()
        difference = d.get(f"minus_{REFERENCE}")
        interval = "no interval (1 seed)" if pd.isna(d.get("low")) else f"[{d['low']:+.2f}, {d['high']:+.2f}]"
        vs = f"{difference:+.2f} {interval}" if difference is not None and not pd.isna(difference) else ""
        wins = f"{d['wins']:.0f}/{d['losses']:.0f}" if vs else ""
        p = f"{d['p']:.3g}" if vs else ""
        paper = "" if d["paper"] is None or pd.isna(d["paper"]) else f"{d['paper']:.2f}"
        lines.append(f"| {d['setup']} | {d['metric']} | {d['seeds']} | {d['mean']:.2f} | {paper} | {vs} | {wins} | {p} "
                     f"| {d.get('verdict') if vs else ''} |")  # fmt: skip
    paired_seeds = table["paired_seeds"].dropna() if "paired_seeds" in table else pd.Series(dtype=float)
    if len(paired_seeds):
        n = int(paired_seeds.max())
        lines += ["", f"A verdict: from {MIN_SEEDS} paired seeds or more, the 95% t-interval of the paired differences "
                  "excludes 0, the setup wins (loses) in more than half the seeds, and the paired t-test's p, Holm-adjusted over "
                  f"the setup's four AUCs (p_holm in retrieval.csv), is below {HOLM}. With n paired seeds the exact "
                  f"sign-flip p cannot fall below 2 / 2^n ({2 / 2**n:.3g} at the most seeds here, {n}): a verdict here rests on the t-test (normal "
                  "differences), not on the sign test."]  # fmt: skip
    (out / "retrieval.md").write_text("\n".join(lines) + "\n")
    return table
