"""The paper's findings, each judged at a recall grid's scale by a stated rule over the generated comparisons
(``comparisons.py``) and the per-point table (``summary.recall_by_distance``): the verdict and the rows it rests
on are written by the grid, so a results page cites them instead of typing its own.

Points "beyond the window" are those whose episodes are longer than the training window. The rules:

1. *Blindness can impair retrieval*: among setups that recall above the best constant answer at their farthest
   in-window point (``higher`` than ``baseline``), a head that carries recall (its ablation costs at least
   ``attribution.CARRIES``) and is exactly blind by a point beyond the window in most of the seeds it carries in;
   **consistent, not isolated** where capping the bias is ``higher`` there (the cap also lifts weights the bias
   lowered without zeroing them, so the zeros' own share is not separated); **not testable here** where blindness
   occurs only in setups that never recall (they have no recall to lose); else **not shown**.
2. *Log-scaled distances give the most consistent improvement*: **reproduces alone** where ``log_distance`` is
   ``higher`` than ALiBi at the most points beyond the window of any setup and ``lower`` at none; otherwise **not
   reproduced alone**, and a combination that holds log distances is named where it is the most often higher
   (which of its parts does it is not separated without their other combinations).
3. *Default ALiBi slopes remain a strong baseline*: **not beaten** where no other slope scheme is ``higher`` than
   ALiBi at any point; the points where each is ``lower`` are the evidence.
4. *Blindness can be told apart from out-of-context degradation*: where ALiBi ran with the cap, **partly**: recall
   the cap restores was lost to the bias (blind heads and low weights together); what it leaves is not attributed,
   as the cap changes the model by itself (the setups whose capped recall is ``lower`` are named); **not tested**
   without capped runs.
5. *Only a minor effect on standard benchmarks*: **not tested**: a recall grid runs no benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from blindheads.evaluation.attribution import CARRIES
from blindheads.evaluation.tags import distance_point
from blindheads.experiments.comparisons import BASELINE, CAPPED, REFERENCE

BLIND = 0.5  # share of a point's episodes whose carriers all give the fact exactly 0, for the point to count blind
SLOPE_SCHEMES = ("steep", "safe", "wide", "robust")
LOG_DISTANCES = ("log_distance", "clamp_log_distance", "wide_clamp_log_distance")  # log_distance: the change alone
COMPONENTS = ("wide", "clamp")  # the combinations' other parts, alone: their rows stand beside the combinations'


@dataclass(frozen=True)
class Finding:
    number: int
    claim: str
    verdict: str
    evidence: str


class Rows:
    """The comparisons with their verdicts, looked up by pair and point."""

    def __init__(self, comparisons: pd.DataFrame, verdicts: pd.DataFrame) -> None:
        self.table = comparisons.assign(verdict=verdicts["verdict"]).set_index(["setup_a", "setup_b", "point"])

    def verdict(self, a: str, b: str, point: str) -> str | None:
        key = (a, b, point)
        return self.table.loc[key, "verdict"] if key in self.table.index else None

    def cite(self, a: str, b: str, point: str) -> str:
        """``nope - alibi at 4x: +0.11 [-0.20, +0.44], 5/0/3 seeds``."""
        row = self.table.loc[(a, b, point)]
        counts = f"{row['wins']}/{row['ties']}/{row['losses']}"
        interval = f"[{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]" if row["seeds"] > 1 else "[one seed]"
        return f"{a} - {b} at {point.removeprefix('distance')}: {row['mean_diff']:+.2f} {interval}, {counts} seeds"

    def points_where(self, a: str, b: str, verdict: str, points: list[str]) -> list[str]:
        return [p for p in points if self.verdict(a, b, p) == verdict]


def named(points: list[str]) -> str:
    """``0.5x, 4x``, or ``no point``."""
    return ", ".join(p.removeprefix("distance") for p in points) or "no point"


def beyond_window(distances: pd.DataFrame) -> list[str]:
    """The distance points whose episodes are longer than the training window, nearest first."""
    longer = distances[distances["length"] > distances["window"]]
    return [distance_point(f) for f in sorted(longer["factor"].unique())]


def judge(
    comparisons: pd.DataFrame, verdicts: pd.DataFrame, distances: pd.DataFrame, heads: pd.DataFrame
) -> list[Finding]:
    """Each finding's verdict and evidence by the module's rules; ``heads``: ``summary.head_attribution``'s table."""
    rows, beyond = Rows(comparisons, verdicts), beyond_window(distances)
    setups = list(dict.fromkeys(distances["setup"]))
    return [
        _blindness(rows, beyond, distances, heads),
        _log_distances(rows, beyond, setups),
        _strong_baseline(rows, setups),
        _separable(rows, beyond, distances),
        Finding(5, "Only a minor effect on standard benchmarks", "not tested", "a recall grid runs no benchmark"),
    ]


def _blindness(rows: Rows, beyond: list[str], distances: pd.DataFrame, heads: pd.DataFrame) -> Finding:
    claim = "Blindness can substantially impair token retrieval"
    inside = [distance_point(f) for f in sorted(distances["factor"].unique()) if distance_point(f) not in beyond]
    setups = list(dict.fromkeys(distances["setup"]))
    learned = [s for s in setups if inside and rows.verdict(s, BASELINE, inside[-1]) == "higher"]
    window = distances["window"].iloc[0]
    carriers = heads[(heads["ablation_cost"] >= CARRIES)] if not heads.empty else heads
    blind_heads, restored, evidence = [], [], []
    for setup in learned:
        own = carriers[carriers["setup"] == setup]
        for (layer, head), frame in own.groupby(["layer", "head"]):
            far = frame[frame["blind_by"] > window]
            if len(far) * 2 > len(frame):  # exactly blind beyond the window in most seeds it carries recall in
                point = distance_point(far["blind_by"].min() / window)
                blind_heads.append((setup, point))
                evidence.append(f"{setup} l{layer}h{head} exactly blind by {named([point])} in {len(far)} of the "
                                f"{len(frame)} seeds it carries recall in")  # fmt: skip
                if rows.verdict(setup + CAPPED, setup, point) == "higher":
                    restored.append(rows.cite(setup + CAPPED, setup, point))
    shares = distances[distances["factor"].map(distance_point).isin(beyond)]
    never = [s for s in setups if s not in learned and shares.loc[shares["setup"] == s, "blind_share"].max() > 0]
    untested = f"blind, but never above the best constant answer in the window: {', '.join(never) or 'none'}"
    if restored:
        verdict = (
            "consistent, not isolated: heads that carry recall go exactly blind beyond the window, and capping the "
            "bias there restores recall; the cap also raises every weight the bias lowered without zeroing it"
        )
        return Finding(1, claim, verdict, "; ".join([*evidence, *dict.fromkeys(restored), untested]))
    if never and not blind_heads:
        verdict = f"not testable here: blindness occurs only in setups that never recall ({', '.join(never)})"
        return Finding(1, claim, verdict, untested)
    return Finding(1, claim, "not shown", "; ".join([*evidence, untested]))


def _log_distances(rows: Rows, beyond: list[str], setups: list[str]) -> Finding:
    claim = "Log-scaled distances give the most consistent improvement"
    tally = {
        s: (rows.points_where(s, REFERENCE, "higher", beyond), rows.points_where(s, REFERENCE, "lower", beyond))
        for s in setups
        if s != REFERENCE
    }
    if not any(s in LOG_DISTANCES for s in tally):
        return Finding(2, claim, "not tested: no log-distance setup ran", "")
    evidence = "; ".join(
        f"{s} - {REFERENCE} higher at {named(h)}, lower at {named(low)}"
        for s, (h, low) in tally.items()
        if s in LOG_DISTANCES or s in COMPONENTS
    )
    clean = {s: len(h) for s, (h, low) in tally.items() if not low and h}
    most = max(clean.values(), default=0)
    best = [s for s, n in clean.items() if n == most and s in LOG_DISTANCES]
    if LOG_DISTANCES[0] in best:
        return Finding(2, claim, "reproduces alone", evidence)
    alone = "not reproduced alone" if LOG_DISTANCES[0] in tally else "not tested alone"
    if best:
        return Finding(
            2, claim, f"{alone}; in combination ({', '.join(best)}) higher than ALiBi at the most points", evidence
        )
    return Finding(2, claim, f"{alone}; no log-distance setup is the most often higher without being lower", evidence)


def _strong_baseline(rows: Rows, setups: list[str]) -> Finding:
    claim = "Default ALiBi slopes remain a strong baseline"
    schemes = [s for s in SLOPE_SCHEMES if s in setups]
    if REFERENCE not in setups or not schemes:
        return Finding(3, claim, "not tested: ALiBi or the other slope schemes did not run", "")
    points = list(dict.fromkeys(p for _, b, p in rows.table.index if b == REFERENCE))
    above = [(s, p) for s in schemes for p in rows.points_where(s, REFERENCE, "higher", points)]
    evidence = "; ".join(
        f"{s} lower than {REFERENCE} at {named(rows.points_where(s, REFERENCE, 'lower', points))}" for s in schemes
    )
    if above:
        return Finding(
            3, claim, "not reproduced: " + ", ".join(f"{s} higher at {named([p])}" for s, p in above), evidence
        )
    return Finding(
        3, claim, f"not beaten: no other slope scheme ({', '.join(schemes)}) is higher at any point", evidence
    )


def _separable(rows: Rows, beyond: list[str], distances: pd.DataFrame) -> Finding:
    claim = "These effects can be told apart from out-of-context degradation"
    capped = [p for p in beyond if rows.verdict(REFERENCE + CAPPED, REFERENCE, p) is not None]
    if not capped:
        return Finding(4, claim, "not tested: ALiBi ran without the evaluation-time cap", "")
    ours = distances[distances["setup"] == REFERENCE]
    recall = ours.groupby(ours["factor"].map(distance_point))[["exact", "exact_capped"]].mean()
    bias = rows.points_where(REFERENCE + CAPPED, REFERENCE, "higher", capped)
    distorted = [
        f"{a.removesuffix(CAPPED)} at {named([p])}"
        for a, b, p in rows.table.index
        if a.endswith(CAPPED) and rows.verdict(a, b, p) == "lower"
    ]
    verdict = (
        f"partly: capping the bias restores ALiBi's recall at {named(bias)} (the bias's share, its blind heads and "
        "its merely low weights together); what the cap leaves is not attributable to length alone, since the cap "
        f"lowers recall by itself in {', '.join(distorted) or 'no setup'}"
    )
    evidence = [
        f"{rows.cite(REFERENCE + CAPPED, REFERENCE, p)} (recall {recall.loc[p, 'exact']:.2f} -> "
        f"{recall.loc[p, 'exact_capped']:.2f})"
        for p in capped
    ]
    return Finding(4, claim, verdict, "; ".join(evidence))


def findings_markdown(findings: list[Finding]) -> str:
    lines = ["| finding | verdict at this scale | evidence (rows of `comparisons.csv`) |", "|---|---|---|"]
    lines += [f"| {f.number}. {f.claim} | {f.verdict} | {f.evidence or '-'} |" for f in findings]
    return "\n".join(lines) + "\n"


def write_findings(
    out: Path, comparisons: pd.DataFrame, verdicts: pd.DataFrame, distances: pd.DataFrame, heads: pd.DataFrame
) -> None:
    """``findings.md``: the table the results page and the README show."""
    rules = "Rules: `blindheads/experiments/findings.py`; intervals and verdicts: `comparisons.py`.\n\n"
    (out / "findings.md").write_text(rules + findings_markdown(judge(comparisons, verdicts, distances, heads)))
