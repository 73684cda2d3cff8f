"""Deaf before blind: do small weights cost learning? The rule of ``results/learning_horizon/``, written before its
runs, judged from the grid's paired comparisons, and returned as a verdict record that one template renders.

Two arms that differ in one thing (``configs/experiments/learning_horizon.yaml``): ``alibi`` and
``alibi_gradient_floor``, whose forward pass is bit-identical and whose backward pass sees every key at least
``e^-H`` of its row's largest weight. The **far point** is the farthest in-window point (where the fewest heads are
within the horizon), the **near point** the nearest; the **family** of the claim is the in-window points beyond the
near one (Holm over them alone). With ``d = alibi_gradient_floor - alibi`` in exact recall, paired by seed and
episode:

- **not decidable** where the control does not learn: ``alibi`` is not above the best constant answer at the near
  point (``comparisons.verdicts`` against ``baseline``);
- **cost** (small weights cost learning: heads past the horizon learn to read the fact once gradient reaches them)
  where at the far point ``d >= COST_GAIN`` with its interval above 0, the gradient-only arm higher in at least
  ``MIN_WINS`` of the seeds and ``p_holm < HOLM`` in the family, and at the near point ``|d| <= NEAR_TIE``;
- **no cost** where at the far point the plain arm leaves at least ``HEADROOM`` to gain (1 - its recall) and the
  interval of ``d`` lies within ``+-NO_COST_MARGIN``;
- **undecided** otherwise; **not tested** where either arm did not run.

Beside the verdict: at each point, how many heads read the fact in each arm (``READS``: a mean absolute fact weight,
from the answer's query, of at least 1%).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from blindheads.evaluation.tags import RECALL, at_stage, distance_point
from blindheads.experiments.grid.comparisons import BASELINE, HOLM, holm
from blindheads.experiments.grid.comparisons import verdicts as rule_verdicts

CONTROL, TREATMENT = "alibi", "alibi_gradient_floor"
COST_GAIN, NEAR_TIE, NO_COST_MARGIN, HEADROOM, MIN_WINS = 0.05, 0.02, 0.03, 0.3, 6
READS = 0.01  # a head reads the fact where its mean fact weight (absolute, not relative to the row) is at least this
CLAIM = "small weights cost learning: heads past the learning horizon learn to read a fact once gradient reaches them"


@dataclass(frozen=True)
class Verdict:
    """What the rule decided (``status``), which condition decided it (``reason``), and the rows it rests on."""

    status: str  # cost, no cost, undecided, not decidable, not tested
    reason: str
    far: str | None = None
    near: str | None = None
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # the comparisons it read, p_holm over the family
    readers: pd.DataFrame = field(default_factory=pd.DataFrame)  # setup x point: mean heads reading the fact
    seeds: pd.DataFrame = field(default_factory=pd.DataFrame)  # per seed: each arm's recall at the near and far point


def in_window_points(distances: pd.DataFrame) -> dict[str, float]:
    """The in-window distance points, nearest first, as comparisons name them -> their window multiple."""
    inside = distances[distances["length"] <= distances["window"]].sort_values("factor")
    return {distance_point(f): f for f in dict.fromkeys(inside["factor"])}


def readers(records: list[dict], threshold: float = READS) -> pd.DataFrame:
    """Per setup and point, the mean over seeds of how many heads give the fact a mean weight of at least
    ``threshold`` from the answer's query."""
    rows = []
    for record in records:
        metrics = record.get("metrics", {})
        counts: dict[str, int] = {}
        for match in at_stage(RECALL, metrics):
            if match["distance"] and match["part"].startswith("weight/"):
                counts[match["point"]] = counts.get(match["point"], 0) + int(float(metrics[match.string]) >= threshold)
        rows += [
            {"setup": record["setup"], "seed": record["seed"], "point": p, "readers": n} for p, n in counts.items()
        ]
    if not rows:
        return pd.DataFrame(columns=["setup", "point", "readers"])
    return pd.DataFrame(rows).groupby(["setup", "point"], sort=False)["readers"].mean().reset_index()


def per_seed(distances: pd.DataFrame, near: float, far: float) -> pd.DataFrame:
    """Per seed, each arm's exact recall at the near and the far point (a grid whose seeds split into ones that learn
    and ones that do not shows it here, where means hide it)."""
    at = distances[distances["setup"].isin([CONTROL, TREATMENT]) & distances["factor"].isin([near, far])]
    table = at.assign(where=np.where(at["factor"] == near, "near", "far"))
    return table.pivot_table(index="seed", columns=["setup", "where"], values="exact").sort_index()


def judge(comparisons: pd.DataFrame, distances: pd.DataFrame, records: list[dict]) -> Verdict:
    """The verdict of the module's rule."""
    setups = set(distances["setup"])
    if not {CONTROL, TREATMENT} <= setups:
        return Verdict("not tested", f"needs both {CONTROL} and {TREATMENT}; ran: {', '.join(sorted(setups))}")
    factors = in_window_points(distances)
    points = list(factors)
    if len(points) < 2:
        return Verdict("not tested", f"needs at least two in-window points, measured: {', '.join(points) or 'none'}")
    near, far, family = points[0], points[-1], points[1:]
    pair = comparisons[(comparisons["setup_a"] == TREATMENT) & (comparisons["setup_b"] == CONTROL)]
    rows = pair[pair["point"].isin(points)].copy()
    in_family = rows["point"].isin(family)
    rows.loc[in_family, "p_holm"] = holm(rows.loc[in_family, "p_t"], pd.Series(0, index=rows[in_family].index))
    rows.loc[~in_family, "p_holm"] = rows.loc[~in_family, "p_t"]
    rows["verdict"] = rule_verdicts(rows.reset_index(drop=True))["verdict"].to_numpy()
    at = rows.set_index("point")
    control = comparisons[(comparisons["setup_a"] == CONTROL) & (comparisons["setup_b"] == BASELINE)]
    learns = rule_verdicts(control.reset_index(drop=True)).set_index("point")["verdict"].get(near) == "higher"
    found = readers(records)
    verdict = {"far": far, "near": near, "rows": rows.reset_index(drop=True), "readers": found,
               "seeds": per_seed(distances, factors[near], factors[far])}  # fmt: skip
    if not learns:
        return Verdict("not decidable", f"{CONTROL} is not above the best constant answer at {near}", **verdict)
    d_far, d_near = at.loc[far], at.loc[near]
    recall = distances[(distances["setup"] == CONTROL) & (distances["factor"] == factors[far])]["exact"].mean()
    if (d_far["mean_diff"] >= COST_GAIN and d_far["ci_low"] > 0 and d_far["wins"] >= MIN_WINS
            and d_far["p_holm"] < HOLM and abs(d_near["mean_diff"]) <= NEAR_TIE):  # fmt: skip
        reason = (f"at {far} the gradient-only arm recalls >= {COST_GAIN} more with its interval above 0 in "
                  f"{d_far['wins']} of {d_far['seeds']} seeds (p_holm < {HOLM}), and within {NEAR_TIE} at {near}")  # fmt: skip
        return Verdict("cost", reason, **verdict)
    if 1 - recall >= HEADROOM and d_far["ci_low"] >= -NO_COST_MARGIN and d_far["ci_high"] <= NO_COST_MARGIN:
        reason = (f"{CONTROL} leaves {1 - recall:.2f} to gain at {far} and the interval there lies within "
                  f"+-{NO_COST_MARGIN}")  # fmt: skip
        return Verdict("no cost", reason, **verdict)
    return Verdict("undecided", f"neither rule holds at {far} ({CONTROL} recalls {recall:.2f} there)", **verdict)


def markdown(verdict: Verdict) -> str:
    """The verdict as a results page shows it: the status and its reason, then the rows and the readers."""
    lines = [f"**{CLAIM}**: {verdict.status} ({verdict.reason}).", "",
             "Rule: `blindheads/experiments/grid/learning_horizon.py`, written before the runs.", ""]  # fmt: skip
    if not verdict.rows.empty:
        lines += ["| point | alibi_gradient_floor - alibi | interval | wins/ties/losses | p_holm | paired |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for _, row in verdict.rows.iterrows():
            lines.append(
                f"| {row['point'].removeprefix('distance')} | {row['mean_diff']:+.3f} | "
                f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}] | {row['wins']}/{row['ties']}/{row['losses']} | "
                f"{row['p_holm']:.3g} | {'yes' if row.get('paired') else 'no'} |"
            )
    if not verdict.seeds.empty:
        columns = [(setup, where) for setup in (CONTROL, TREATMENT) for where in ("near", "far")]
        lines += ["", f"Per seed, exact recall at the near point ({verdict.near}) and the far point ({verdict.far}):", "",
                  "| seed | " + " | ".join(f"{s} {w}" for s, w in columns) + " |", "|---" * (len(columns) + 1) + "|"]  # fmt: skip
        for seed, row in verdict.seeds.iterrows():
            cells = [f"{row[c]:.3f}" if c in row.index and pd.notna(row[c]) else "-" for c in columns]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    if not verdict.readers.empty:
        wide = verdict.readers.pivot(index="setup", columns="point", values="readers")
        lines += ["", f"Heads reading the fact (mean absolute fact weight >= {READS}), mean over seeds:", "",
                  "| setup | " + " | ".join(p.removeprefix("distance") for p in wide.columns) + " |",
                  "|---" * (len(wide.columns) + 1) + "|"]  # fmt: skip
        lines += [f"| {s} | " + " | ".join(f"{v:.1f}" for v in wide.loc[s]) + " |" for s in wide.index]
    return "\n".join(lines) + "\n"
