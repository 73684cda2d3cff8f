"""Paired comparisons between a grid's setups: at each recall point, the difference in exact recall with a bootstrap
interval over seeds and episodes, and a verdict by fixed rules, so the results page states what the runs show
rather than what a mean and a spread suggest.

A seed fixes the initialisation and the data order, so setups are compared seed by seed: the difference
``setup_a - setup_b`` is the mean over seeds (each seed one unit, whatever its episode count) of the per-seed
differences in recall.

- **Interval** (95%): a hierarchical bootstrap: resample the seeds, then within each resampled seed redraw each
  setup's correct count from a binomial at its recall (the bootstrap of its episodes' 0/1 outcomes). With a
  handful of seeds the plain percentile interval is too narrow (a normal quantile where a t is due: about 85% at 5
  seeds where the seeds' spread is all the noise), so it is widened by Hesterberg's expansion (The American
  Statistician 69, 2015): percentiles at ``Phi(-sqrt(n / (n - 1)) t)``, ``t`` the 97.5% quantile of Student's t
  with ``n - 1`` degrees of freedom. Redrawing episodes counts their noise a second time (the seed spread already
  holds it), and the two setups' episodes are redrawn independently although a seed gives both the same episodes:
  both widen the interval (identical setups get about +-0.1 at 64 episodes). Per-episode outcomes, once logged,
  would let a seed's episodes be redrawn once for both setups: the binomial draws in ``bootstrap_interval`` are the
  one place to change. One seed gives no interval.
- **Sign-flip p-value** (two-sided, exact): the share of the ``2^n`` sign patterns of the per-seed differences
  whose sum is at least as far from 0 as the observed one. It cannot go below ``2 / 2^n``: 0.0625 at 5 seeds.
  Reported, not used by the verdicts.
- **Verdict**: ``higher`` (``lower``) where the interval lies above (below) 0 and setup_a wins (loses) in more
  than half the seeds; else ``no difference shown``.
- **The cap**: where a run logged ``exact_capped`` (recall with every head's bias held at its value at the
  training window's edge, ``evaluation/attribution.py``), it enters as the setup ``SETUP capped`` and is compared
  with ``SETUP``: ``higher`` means recall returned under the cap, so the bias beyond the window lost it. Both score
  the same episodes; drawn independently here, which widens the interval.
- **Baseline**: where the table has ``baseline`` (each seed's share of the most common answer at the point: what a
  model answering one constant would score), it enters as a setup named ``baseline``, each setup is compared with
  it, and a setup whose difference from it is not ``higher`` is ``at baseline`` there.
"""

from __future__ import annotations

import math
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from blindheads.evaluation.tags import RECALL, at_stage, recall_tag

LEVEL = 0.95
REFERENCE = "alibi"
PAIRS = (  # beside each setup against the reference: one change at a time among the log-distance setups
    ("clamp_log_distance", "log_distance"),  # the clamp
    ("wide_clamp_log_distance", "clamp_log_distance"),  # the wide slopes
)
BASELINE = "baseline"
CAPPED = " capped"  # a setup's name + this: its recall with the bias capped beyond the window
NO_DIFFERENCE = "no difference shown"


def per_seed_recall(records: list[dict]) -> pd.DataFrame:
    """One row per setup, seed and recall point (``distance2x``, ``gap8``): correct answers out of episodes, and
    the point's best-constant ``baseline`` where the run logged one. ``EpisodeRecall`` logs shares: a point's
    episode count is its ``episodes`` tag where logged, else the smallest count every run's share there is a
    multiple of (too small only if every share happens to be coarse, which widens the interval)."""
    rows = []
    for record in records:
        metrics = record.get("metrics", {})
        for match in at_stage(RECALL, metrics):
            if (match["gap"] or match["distance"]) and match["part"] in ("exact", "exact_capped"):
                point = match["point"]
                rows.append(
                    {
                        "setup": record["setup"] + (CAPPED if match["part"] == "exact_capped" else ""),
                        "seed": record["seed"],
                        "point": point,
                        "kind": "gap" if match["gap"] else "distance",
                        "number": float(match["gap"] or match["distance"]),
                        "exact": float(metrics[match.string]),
                        "episodes": metrics.get(recall_tag(point, "episodes", "test/")),
                        "baseline": metrics.get(recall_tag(point, "baseline", "test/")),
                    }
                )
    if not rows:
        return pd.DataFrame(columns=["setup", "seed", "point", "correct", "episodes"])
    table = pd.DataFrame(rows)
    smallest = table.groupby("point")["exact"].agg(lambda shares: math.lcm(*(_denominator(s) for s in shares)))
    table["episodes"] = table["episodes"].fillna(table["point"].map(smallest)).astype(int)
    table["correct"] = (table["exact"] * table["episodes"]).round().astype(int)
    table = table.sort_values(["kind", "number"], kind="stable").drop(columns=["kind", "number", "exact"])
    return table.dropna(axis="columns", how="all").reset_index(drop=True)


def pairs(setups: list[str], reference: str = REFERENCE, named=PAIRS) -> list[tuple[str, str]]:
    """Each setup against ``reference``, then the ``named`` pairs whose setups are all in ``setups``, then each
    capped setup against itself uncapped."""
    plain = [s for s in setups if not s.endswith(CAPPED)]
    chosen = [(setup, reference) for setup in plain if reference in plain and setup != reference]
    chosen += [(a, b) for a, b in named if a in plain and b in plain and (a, b) not in chosen]
    return chosen + [(s, s.removesuffix(CAPPED)) for s in setups if s.endswith(CAPPED)]


def sign_flip_p(differences: np.ndarray) -> float:
    """Two-sided exact sign-flip p-value of the per-seed differences (every one of the ``2^n`` sign patterns: a
    grid's handful of seeds, not hundreds)."""
    n = len(differences)
    signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
    sums = np.abs(signs @ differences)
    return float(np.mean(sums >= abs(differences.sum()) - 1e-12))


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for ``p`` above 0.5 and an integer ``df``: bisection on the finite-series CDF
    (Abramowitz and Stegun 26.7.3-4), as numpy has none."""

    def central(t: float) -> float:  # P(|T| <= t)
        theta, odd = math.atan(t / math.sqrt(df)), df % 2
        term, total = math.cos(theta) if odd else 1.0, 0.0
        for k in range(1, df // 2 + 1):
            total += term
            term *= math.cos(theta) ** 2 * (2 * k - 1 + odd) / (2 * k + odd)
        return 2 / math.pi * (theta + math.sin(theta) * total) if odd else math.sin(theta) * total

    low, high = 0.0, 1e6
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if central(middle) < 2 * p - 1 else (low, middle)
    return (low + high) / 2


def bootstrap_interval(
    correct_a: np.ndarray,
    episodes_a: np.ndarray,
    correct_b: np.ndarray,
    episodes_b: np.ndarray,
    rng: np.random.Generator,
    resamples: int = 20_000,
) -> tuple[float, float]:
    """The expanded-percentile interval of the mean per-seed difference in recall, a - b, arrays indexed by seed;
    NaN for one seed."""
    n = len(correct_a)
    if n < 2:
        return math.nan, math.nan
    seeds = rng.integers(0, n, size=(resamples, n))
    a = rng.binomial(episodes_a[seeds], correct_a[seeds] / episodes_a[seeds]) / episodes_a[seeds]
    b = rng.binomial(episodes_b[seeds], correct_b[seeds] / episodes_b[seeds]) / episodes_b[seeds]
    tail = 0.5 * math.erfc(math.sqrt(n / (n - 1)) * t_quantile(1 - (1 - LEVEL) / 2, n - 1) / math.sqrt(2))
    low, high = np.quantile((a - b).mean(axis=1), [tail, 1 - tail])
    return float(low), float(high)


def compare(table: pd.DataFrame, chosen: list[tuple[str, str]], seed: int = 0, resamples: int = 20_000) -> pd.DataFrame:
    """One row per pair and point, over the seeds both setups ran: mean difference a - b, interval, seeds,
    wins / ties / losses of a, sign-flip p. A ``baseline`` column adds each setup against ``baseline``. Each
    pair and point draws from its own generator, so a row does not depend on which others are computed."""
    if "baseline" in table:
        constant = table.dropna(subset=["baseline"]).drop_duplicates(["seed", "point"]).assign(setup=BASELINE)
        constant["correct"] = (constant["baseline"] * constant["episodes"]).round().astype(int)
        table = pd.concat([table, constant], ignore_index=True)
        setups = dict.fromkeys(s for s in table["setup"] if s != BASELINE and not s.endswith(CAPPED))
        chosen = chosen + [(setup, BASELINE) for setup in setups]
    rows = []
    for point in dict.fromkeys(table["point"]):
        at = table[table["point"] == point].pivot(index="seed", columns="setup", values=["correct", "episodes"])
        for a, b in chosen:
            if a not in at["correct"] or b not in at["correct"]:
                continue
            both = at.loc[:, (slice(None), [a, b])].dropna().astype(int)
            ca, na, cb, nb = (both[column, setup].to_numpy() for setup in (a, b) for column in ("correct", "episodes"))
            order = np.sign(ca * nb - cb * na)  # exact, in integers
            differences = ca / na - cb / nb
            rng = np.random.default_rng([seed, zlib.crc32(f"{a}|{b}|{point}".encode())])
            low, high = bootstrap_interval(ca, na, cb, nb, rng, resamples)
            rows.append(
                {
                    "setup_a": a,
                    "setup_b": b,
                    "point": point,
                    "mean_diff": differences.mean(),
                    "ci_low": low,
                    "ci_high": high,
                    "seeds": len(both),
                    "wins": int((order > 0).sum()),
                    "ties": int((order == 0).sum()),
                    "losses": int((order < 0).sum()),
                    "p_sign_flip": sign_flip_p(differences),
                }
            )
    return pd.DataFrame(rows)


def verdicts(comparisons: pd.DataFrame) -> pd.DataFrame:
    """Each comparison's verdict by the module's rules, and the pair's setups ``at_baseline`` where the
    comparisons hold a baseline."""
    higher = (comparisons["ci_low"] > 0) & (comparisons["wins"] > comparisons["seeds"] / 2)
    lower = (comparisons["ci_high"] < 0) & (comparisons["losses"] > comparisons["seeds"] / 2)
    table = comparisons[["setup_a", "setup_b", "point"]].copy()
    table["verdict"] = np.select([higher, lower], ["higher", "lower"], NO_DIFFERENCE)
    against = table["setup_b"] == BASELINE
    if against.any():
        below = set(zip(table.loc[against & ~higher, "setup_a"], table.loc[against & ~higher, "point"]))
        table["at_baseline"] = [
            " ".join(s for s in (a, b) if (s, point) in below)
            for a, b, point in zip(table["setup_a"], table["setup_b"], table["point"])
        ]
    return table


def verdict_markdown(comparisons: pd.DataFrame, table: pd.DataFrame) -> str:
    """Pair x point: ``mean [interval] wins/ties/losses``, bold where the verdict is a finding."""
    points = list(dict.fromkeys(comparisons["point"]))
    lines = [
        f"Exact recall, setup_a - setup_b: mean over seeds [{LEVEL:.0%} interval, seeds and episodes resampled] "
        "and setup_a's wins/ties/losses over the seeds. **Bold**: the interval excludes 0 and setup_a wins (or "
        f"loses) in most seeds; otherwise {NO_DIFFERENCE}. Rules: `blindheads/experiments/comparisons.py`.",
        "",
        "| setup_a - setup_b | " + " | ".join(p.removeprefix("distance") for p in points) + " |",
        "|---" * (len(points) + 1) + "|",
    ]
    rows = comparisons.assign(verdict=table["verdict"], at_baseline=table.get("at_baseline", ""))
    for (a, b), pair in rows.groupby(["setup_a", "setup_b"], sort=False):
        cells = dict.fromkeys(points, "")  # a pair not compared at a point (a baseline only some points have)
        for _, row in pair.iterrows():
            counts = "/".join(str(row[c]) for c in ("wins", "ties", "losses"))
            interval = f"{row['ci_low']:+.2f}, {row['ci_high']:+.2f}" if row["seeds"] > 1 else "one seed: no interval"
            cell = f"{row['mean_diff']:+.2f} [{interval}] {counts}"
            cell = cell if row["verdict"] == NO_DIFFERENCE else f"**{cell}**"
            cells[row["point"]] = cell + (f" (not above baseline: {row['at_baseline']})" if row["at_baseline"] else "")
        lines.append(f"| {a} - {b} | " + " | ".join(cells.values()) + " |")
    return "\n".join(lines) + "\n"


def write_comparisons(
    out: Path, records: list[dict], reference: str = REFERENCE, named=PAIRS
) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """``comparisons.csv``, ``verdicts.csv`` and ``verdicts.md`` where the runs measured recall per point, for
    the pairs of ``pairs`` among the records' setups; returns the comparisons and their verdicts (else None)."""
    table = per_seed_recall(records)
    chosen = pairs(list(dict.fromkeys(table.get("setup", []))), reference, named)
    if table.empty or not (chosen or "baseline" in table):
        return None
    comparisons = compare(table, chosen)
    verdict = verdicts(comparisons)
    comparisons.to_csv(out / "comparisons.csv", index=False)
    verdict.to_csv(out / "verdicts.csv", index=False)
    (out / "verdicts.md").write_text(verdict_markdown(comparisons, verdict))
    return comparisons, verdict


def _denominator(share: float) -> int:
    return Fraction(share).limit_denominator(10_000).denominator
