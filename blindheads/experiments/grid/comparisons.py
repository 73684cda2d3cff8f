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
  with ``n - 1`` degrees of freedom. Where both setups of a seed kept their per-episode outcomes on the same
  episodes (``episode_outcomes``, ``episode_sets`` in ``results.json``), a seed's episodes are redrawn **once for
  both** (``paired``: a multinomial draw of the episodes a wins, loses and ties); else each setup's are redrawn
  independently (a binomial each), which counts the shared episodes' noise twice and widens the interval (identical
  setups get about +-0.1 at 64 episodes). Redrawing episodes at all counts their noise a second time beside the
  seeds' spread. One seed gives no interval.
- **Sign-flip p-value** (two-sided, exact): the share of the ``2^n`` sign patterns of the per-seed differences
  whose sum is at least as far from 0 as the observed one. It cannot go below ``2 / 2^n``: 0.0625 at 5 seeds.
  Reported, not used by the verdicts.
- **t p-value and Holm** (``p_t``, ``p_holm``): the two-sided paired t-test of the per-seed differences (1 where
  every difference is 0; where all are equal and not 0, the t statistic is undefined and the exact sign-flip p is
  taken), Holm-adjusted within its **family**: one pair of setups at every point it is compared at (``family``
  names it), the comparisons one finding reads from one pair.
- **Verdict**: ``higher`` (``lower``) where the interval lies above (below) 0, setup_a wins (loses) in more than
  half the seeds, and ``p_holm`` is below 0.05; else ``no difference shown``.
- **Interventions at evaluation** (``evaluation/attribution.py``), each entering as a setup compared with the
  plain one on the same episodes (drawn independently here, which widens the interval):
  ``SETUP capped`` (``exact_capped``: every head's bias beyond the window held at its value at the window's edge;
  ``higher`` means the bias beyond the window lost the recall: its zeros, its small weights and its never-trained
  values together), ``SETUP zero-free`` (``exact_zero_free``: the model in float64, the exact zeros alone
  removed) and ``SETUP floored`` (``exact_floored``: every bias held at or above a floor, the smallest weights
  alone lifted).
- **Baseline**: where the table has ``baseline`` (each seed's share of the most common answer at the point: what a
  model answering one constant would score), it enters as a setup named ``baseline``, each setup is compared with
  it, and a setup whose difference from it is not ``higher`` is ``at baseline`` there.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
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
ZERO_FREE = " zero-free"  # ... re-scored in float64, no weight exactly 0
FLOORED = " floored"  # ... with every bias held at or above a floor
INTERVENTIONS = {"exact_capped": CAPPED, "exact_zero_free": ZERO_FREE, "exact_floored": FLOORED}  # tag part -> suffix
NO_DIFFERENCE = "no difference shown"
HOLM = 0.05  # family-wise error rate of the verdicts


def per_seed_recall(records: list[dict]) -> pd.DataFrame:
    """One row per setup, seed and recall point (``distance2x``, ``gap8``): correct answers out of episodes, the
    point's best-constant ``baseline`` where the run logged one, and its per-episode ``outcomes`` and
    ``episode_set`` where the run kept them. ``EpisodeRecall`` logs shares: a point's
    episode count is its ``episodes`` tag where logged, else the smallest count every run's share there is a
    multiple of (too small only if every share happens to be coarse, which widens the interval)."""
    rows = []
    for record in records:
        metrics = record.get("metrics", {})
        for match in at_stage(RECALL, metrics):
            if (match["gap"] or match["distance"]) and match["part"] in ("exact", *INTERVENTIONS):
                point = match["point"]
                rows.append(
                    {
                        "setup": record["setup"] + INTERVENTIONS.get(match["part"], ""),
                        "seed": record["seed"],
                        "point": point,
                        "kind": "gap" if match["gap"] else "distance",
                        "number": float(match["gap"] or match["distance"]),
                        "exact": float(metrics[match.string]),
                        "episodes": metrics.get(recall_tag(point, "episodes", "test/")),
                        "baseline": metrics.get(recall_tag(point, "baseline", "test/")),
                        # one 0/1 per episode, and which episodes (their sha256), where the run kept them
                        "outcomes": (record.get("episode_outcomes") or {}).get(point, {}).get(match["part"]),
                        "episode_set": (record.get("episode_sets") or {}).get(point),
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


def plain_setup(name: str) -> str:
    """``alibi capped`` -> ``alibi``: the setup an intervention's row belongs to."""
    for suffix in INTERVENTIONS.values():
        name = name.removesuffix(suffix)
    return name


def pairs(setups: list[str], reference: str = REFERENCE, named=PAIRS) -> list[tuple[str, str]]:
    """Each setup against ``reference``, then the ``named`` pairs whose setups are all in ``setups``, then each
    intervention (capped, zero-free, floored) against its setup as it is."""
    plain = [s for s in setups if plain_setup(s) == s]
    chosen = [(setup, reference) for setup in plain if reference in plain and setup != reference]
    chosen += [(a, b) for a, b in named if a in plain and b in plain and (a, b) not in chosen]
    return chosen + [(s, plain_setup(s)) for s in setups if plain_setup(s) != s]


def sign_flip_p(differences: np.ndarray) -> float:
    """Two-sided exact sign-flip p-value of the per-seed differences (every one of the ``2^n`` sign patterns: a
    grid's handful of seeds, not hundreds)."""
    n = len(differences)
    signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
    sums = np.abs(signs @ differences)
    return float(np.mean(sums >= abs(differences.sum()) - 1e-12))


def t_central(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with an integer ``df``: the finite series of Abramowitz and Stegun 26.7.3-4
    (numpy has none)."""
    theta, odd = math.atan(t / math.sqrt(df)), df % 2
    term, total = math.cos(theta) if odd else 1.0, 0.0
    for k in range(1, df // 2 + 1):
        total += term
        term *= math.cos(theta) ** 2 * (2 * k - 1 + odd) / (2 * k + odd)
    return 2 / math.pi * (theta + math.sin(theta) * total) if odd else math.sin(theta) * total


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for ``p`` above 0.5 and an integer ``df``: bisection on ``t_central``."""
    low, high = 0.0, 1e6
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if t_central(middle, df) < 2 * p - 1 else (low, middle)
    return (low + high) / 2


def t_test_p(differences: np.ndarray) -> float:
    """Two-sided p of the paired t-test that the per-seed ``differences`` average 0: 1 where all are 0, NaN for one
    seed. Where all are equal and not 0 the t statistic has no spread to divide by (its limit, p = 0, claims more
    than n seeds can show): the exact sign-flip p, ``2 / 2^n``, is taken instead."""
    n = len(differences)
    if n < 2:
        return math.nan
    mean, spread = float(differences.mean()), float(differences.std(ddof=1))
    if spread == 0:
        return 1.0 if mean == 0 else sign_flip_p(differences)
    return 1 - t_central(abs(mean) / (spread / math.sqrt(n)), n - 1)


def holm(p: pd.Series, family: pd.Series) -> pd.Series:
    """Holm's step-down adjustment of the p-values ``p`` within each ``family`` (NaN stays NaN): the k-th smallest
    of m is multiplied by ``m - k + 1``, kept at least the one before, capped at 1."""
    adjusted = pd.Series(np.nan, index=p.index)
    for _, members in p.groupby(family):
        ranked = members.dropna().sort_values(kind="stable")
        m = len(ranked)
        running = 0.0
        for k, (index, value) in enumerate(ranked.items()):
            running = max(running, min(1.0, (m - k) * value))
            adjusted[index] = running
    return adjusted


def paired_t(differences: np.ndarray, level: float = LEVEL) -> dict:
    """Per-seed ``differences`` summarised: mean, Student-t interval (NaN below 2 seeds), wins / ties / losses,
    t and sign-flip p-values: for measures that are already means over many items (losses, AUCs), where the seeds'
    spread is all the noise."""
    n = len(differences)
    mean = float(differences.mean()) if n else math.nan
    low = high = math.nan
    if n > 1:
        half = t_quantile(1 - (1 - level) / 2, n - 1) * differences.std(ddof=1) / math.sqrt(n)
        low, high = mean - half, mean + half
    return {"mean_diff": mean, "ci_low": low, "ci_high": high, "seeds": n, "wins": int((differences > 0).sum()),
            "ties": int((differences == 0).sum()), "losses": int((differences < 0).sum()),
            "p_t": t_test_p(differences), "p_sign_flip": sign_flip_p(differences) if n else math.nan}  # fmt: skip


def bootstrap_interval(
    correct_a: np.ndarray,
    episodes_a: np.ndarray,
    correct_b: np.ndarray,
    episodes_b: np.ndarray,
    rng: np.random.Generator,
    resamples: int = 20_000,
    paired: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[float, float]:
    """The expanded-percentile interval of the mean per-seed difference in recall, a - b, arrays indexed by seed;
    NaN for one seed. ``paired``: per seed, the episodes a answered and b did not, and the reverse, where both
    answered the same episodes: each seed's episodes are then redrawn once for both."""
    n = len(correct_a)
    if n < 2:
        return math.nan, math.nan
    seeds = rng.integers(0, n, size=(resamples, n))
    if paired is None:
        a = rng.binomial(episodes_a[seeds], correct_a[seeds] / episodes_a[seeds]) / episodes_a[seeds]
        b = rng.binomial(episodes_b[seeds], correct_b[seeds] / episodes_b[seeds]) / episodes_b[seeds]
        difference = a - b
    else:
        wins, losses = paired
        shares = np.stack([wins, losses, episodes_a - wins - losses], axis=-1) / episodes_a[:, None]
        drawn = rng.multinomial(episodes_a[seeds], shares[seeds])  # (resamples, n, 3): wins, losses, ties
        difference = (drawn[..., 0] - drawn[..., 1]) / episodes_a[seeds]
    tail = 0.5 * math.erfc(math.sqrt(n / (n - 1)) * t_quantile(1 - (1 - LEVEL) / 2, n - 1) / math.sqrt(2))
    low, high = np.quantile(difference.mean(axis=1), [tail, 1 - tail])
    return float(low), float(high)


def compare(table: pd.DataFrame, chosen: list[tuple[str, str]], seed: int = 0, resamples: int = 20_000) -> pd.DataFrame:
    """One row per pair and point, over the seeds both setups ran: mean difference a - b, interval, seeds,
    wins / ties / losses of a, sign-flip and t p-values, the Holm family (the pair) and ``p_holm``. A ``baseline``
    column adds each setup against ``baseline``. Each
    pair and point draws from its own generator, so a row does not depend on which others are computed."""
    if "baseline" in table:
        constant = table.dropna(subset=["baseline"]).drop_duplicates(["seed", "point"]).assign(setup=BASELINE)
        constant = constant.assign(**{c: None for c in ("outcomes", "episode_set") if c in constant})  # no episodes
        constant["correct"] = (constant["baseline"] * constant["episodes"]).round().astype(int)
        table = pd.concat([table, constant], ignore_index=True)
        setups = dict.fromkeys(s for s in table["setup"] if s != BASELINE and plain_setup(s) == s)
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
            paired = discordant(table, a, b, point, both.index)
            low, high = bootstrap_interval(ca, na, cb, nb, rng, resamples, paired)
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
                    "p_t": t_test_p(differences),
                    "family": f"{a} - {b}",
                    "paired": paired is not None,
                }
            )
    table = pd.DataFrame(rows)
    if not table.empty:
        table["p_holm"] = holm(table["p_t"], table["family"])
    return table


def discordant(table: pd.DataFrame, a: str, b: str, point: str, seeds) -> tuple[np.ndarray, np.ndarray] | None:
    """Per seed, the episodes ``a`` answered and ``b`` did not, and the reverse, at ``point``: where every one of
    ``seeds`` kept both setups' per-episode outcomes on the same episodes (equal ``episode_set``), else None."""
    if "outcomes" not in table or "episode_set" not in table:
        return None
    rows = table[(table["point"] == point) & table["setup"].isin([a, b])].set_index(["setup", "seed"])
    wins, losses = [], []
    for seed in seeds:
        if (a, seed) not in rows.index or (b, seed) not in rows.index:
            return None
        first, second = rows.loc[(a, seed)], rows.loc[(b, seed)]
        same = isinstance(first["episode_set"], str) and first["episode_set"] == second["episode_set"]
        if not (same and isinstance(first["outcomes"], str) and isinstance(second["outcomes"], str)):
            return None
        x, y = (np.frombuffer(o.encode(), dtype=np.uint8) - ord("0") for o in (first["outcomes"], second["outcomes"]))
        if len(x) != len(y):
            return None
        wins.append(int(((x == 1) & (y == 0)).sum()))
        losses.append(int(((x == 0) & (y == 1)).sum()))
    return np.array(wins), np.array(losses)


def verdicts(comparisons: pd.DataFrame) -> pd.DataFrame:
    """Each comparison's verdict by the module's rules, and the pair's setups ``at_baseline`` where the
    comparisons hold a baseline."""
    significant = comparisons["p_holm"] < HOLM
    higher = (comparisons["ci_low"] > 0) & (comparisons["wins"] > comparisons["seeds"] / 2) & significant
    lower = (comparisons["ci_high"] < 0) & (comparisons["losses"] > comparisons["seeds"] / 2) & significant
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
        "and setup_a's wins/ties/losses over the seeds. **Bold**: the interval excludes 0, setup_a wins (or "
        f"loses) in most seeds and the Holm-adjusted t p-value (family: the pair, over its points) is below {HOLM}; "
        f"otherwise {NO_DIFFERENCE}. Rules: `blindheads/experiments/grid/comparisons.py`.",
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


REGIME = "in the window"  # the point of the paper's-regime row: (a - b) beyond the first blind distance minus inside


def regime_row(distances: pd.DataFrame, first_blind: float, a: str = REFERENCE, b: str = "nope") -> dict | None:
    """The paper's regime, heads blind inside the window: per seed, ``a - b`` in exact recall averaged over the
    in-window points beyond ``first_blind`` tokens (``a``'s first blind distance) minus the same inside it; summed up
    as ``paired_t`` does, in ``comparisons.csv``'s columns. Negative: ``a`` loses to ``b`` where its heads are
    blind, beyond what it loses where none is. None where ``a`` or ``b`` did not run or no in-window point lies on
    one side."""
    inside = distances[distances["length"] <= distances["window"]]
    near = inside[inside["distance"] < first_blind]
    far = inside[inside["distance"] > first_blind]
    if near.empty or far.empty or not {a, b} <= set(inside["setup"]):
        return None

    def gap(points: pd.DataFrame) -> pd.Series:
        by_seed = points.pivot_table(index="seed", columns="setup", values="exact", aggfunc="mean")
        return by_seed[a] - by_seed[b]

    differences = (gap(far) - gap(near)).dropna().to_numpy()
    name = f"{a} - {b}"
    row = {"setup_a": f"{name}, beyond {first_blind:.0f} tokens", "setup_b": f"{name}, inside", "point": REGIME,
           **paired_t(differences), "family": f"{name}, beyond - inside {first_blind:.0f} tokens"}  # fmt: skip
    row["p_holm"] = row["p_t"]  # a family of one
    return row


def write_comparisons(
    out: Path, records: list[dict], reference: str = REFERENCE, named=PAIRS, extra: Sequence[dict] = ()
) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """``comparisons.csv``, ``verdicts.csv`` and ``verdicts.md`` where the runs measured recall per point, for
    the pairs of ``pairs`` among the records' setups, and the ``extra`` rows (``regime_row``); returns the
    comparisons and their verdicts (else None)."""
    table = per_seed_recall(records)
    chosen = pairs(list(dict.fromkeys(table.get("setup", []))), reference, named)
    if table.empty or not (chosen or "baseline" in table):
        return None
    comparisons = compare(table, chosen)
    if extra:
        comparisons = pd.concat([comparisons, pd.DataFrame(list(extra))], ignore_index=True)
    verdict = verdicts(comparisons)
    comparisons.to_csv(out / "comparisons.csv", index=False)
    verdict.to_csv(out / "verdicts.csv", index=False)
    (out / "verdicts.md").write_text(verdict_markdown(comparisons, verdict))
    return comparisons, verdict


def _denominator(share: float) -> int:
    return Fraction(share).limit_denominator(10_000).denominator
