"""The paper's findings, each judged at a grid's scale by a stated rule over the generated comparisons
(``comparisons.py``, ``losses.py``) and the per-point table (``summary.recall_by_distance``): the verdict and the rows
it rests on are written by the grid, so a results page cites them instead of typing its own. Each finding names the
comparison that decides it.
A verdict needs ``MIN_SEEDS`` seeds: below that in every pair (a pilot) no finding has one, and in a grid done in
parts a finding whose verdict would read otherwise without the setups that lack them has none yet.

Points "beyond the window" are those whose episodes are longer than the training window; "blind points" of a setup
are the points, inside the window or beyond it, from which a head that carries its recall (ablation cost at least
``attribution.CARRIES``) gives the fact exactly 0 in most of the seeds it carries in. The rules:

1. *Blindness (exact zeros) can substantially impair token retrieval*, decided by **zeros**: the same model without
   exact zeros against it, at the blind points of the setups that recall above the best constant answer. Trained
   (``alibi_zero_free - alibi``: the model in float64 from the first step, gradient through every far weight) where
   the experiment ran it; else re-scored (``SETUP zero-free - SETUP``: float64 at evaluation, which a forward pass can
   hardly tell from float32, so it can only show that the zeros cost nothing at evaluation). **shown** where zero-free
   is ``higher`` at a blind point (Holm over those points alone: the finding's own family); **not shown** where it
   is not at any, with the largest gain the intervals leave open, how often every carrier is blind at once there
   (``carriers_blind``: where never, a blind head always has one that sees beside it, and only that is tested), and
   the carriers blind already where they were ablated (their cost is work nearer than their blind distance, not the
   fact's weight); **not testable here** where blindness
   occurs only in setups that never recall; **not tested** without a zero-free arm or blind carriers. Small weights
   (``SETUP floored - SETUP``, ``clamp - alibi``) and the cap stand beside it as evidence.
2. *Log-scaled distances give the most consistent improvement*: **reproduces alone** where ``log_distance`` is
   ``higher`` than ALiBi at the most points beyond the window of any setup and ``lower`` at none there (the points
   in the window where it is ``lower`` are named beside the verdict); otherwise **not
   reproduced alone**, and a combination that holds log distances is named where it is the most often higher
   (which of its parts does it is not separated without their other combinations).
3. *Default ALiBi slopes remain a strong baseline*: **not beaten** where no other slope scheme is ``higher`` than
   ALiBi at any point; the points where each is ``lower`` are the evidence.
4. *These effects can be told apart from out-of-context degradation*, decided by the **paper's regime** where heads
   go blind inside the window (``alibi - nope`` beyond the first blind distance minus inside it: ``lower`` means
   ALiBi loses recall where its heads are blind, inside the window, so not to untrained lengths), and by the
   **interventions** beyond the window: where the cap restores ALiBi's recall but neither the zero-free nor the
   floored re-score does, the loss is told apart from blindness, and it is the bias's values never met in training;
   **not tested** with neither.
5. *Only a minor effect on standard benchmarks*, decided by **held-out loss** on natural text at the training length
   (``losses.py``), each setup against ALiBi: **consistent** where every setup's interval lies within ``losses.MINOR``
   nats of ALiBi's; **not reproduced** where some setup is ``higher`` or ``lower`` by more; **undecided** where an
   interval is wider than that; **not tested** without held-out losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from blindheads.evaluation.attribution import CARRIES
from blindheads.evaluation.tags import distance_point
from blindheads.experiments.grid.comparisons import (
    BASELINE,
    CAPPED,
    FLOORED,
    REFERENCE,
    REGIME,
    ZERO_FREE,
    holm,
)
from blindheads.experiments.grid.comparisons import verdicts as rule_verdicts
from blindheads.experiments.grid.losses import MINOR, minor
from blindheads.experiments.grid.retrieval_comparisons import MIN_SEEDS

SLOPE_SCHEMES = ("steep", "safe", "wide", "robust")
LOG_DISTANCES = ("log_distance", "clamp_log_distance", "wide_clamp_log_distance")  # log_distance: the change alone
COMPONENTS = ("wide", "clamp")  # the combinations' other parts, alone: their rows stand beside the combinations'
TRAINED_ZERO_FREE = "alibi_zero_free"  # the setup trained without exact zeros (configs/position/)
SMALL_WEIGHTS = "clamp"  # trained with a floor on the bias: no weight below the floor's (where the floor acts)
CONTROL = "nope"  # no position bias: never blind


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

    def wins(self, a: str, b: str, point: str) -> tuple[int, int]:
        """In how many of its seeds ``a`` is above ``b`` at the point, and of how many; (0, 0) where not compared."""
        key = (a, b, point)
        if key not in self.table.index:
            return 0, 0
        return int(self.table.loc[key, "wins"]), int(self.table.loc[key, "seeds"])

    def cite(self, a: str, b: str, point: str) -> str:
        """``nope - alibi at 4x: +0.11 [-0.20, +0.44], 5/0/3 seeds``; the paper's-regime row ``(alibi - nope, beyond
        123 tokens) - (alibi - nope, inside), in the window: ...``."""
        row = self.table.loc[(a, b, point)]
        counts = f"{row['wins']}/{row['ties']}/{row['losses']}"
        interval = f"[{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]" if row["seeds"] > 1 else "[one seed]"
        pair = f"({a}) - ({b}), {point}" if point == REGIME else f"{a} - {b} at {point.removeprefix('distance')}"
        return f"{pair}: {row['mean_diff']:+.2f} {interval}, {counts} seeds"

    def cite_all(self, a: str, b: str, points: list[str]) -> str:
        """One pair at several points, in one clause: each point's mean, the span of their intervals (not an
        interval itself) and the seeds' wins/ties/losses summed (``alibi zero-free - alibi at 4x, 8x: +0.00, +0.00,
        intervals within [-0.03, +0.03], 0/16/0 seed-points``); one point is ``cite``'s clause."""
        if len(points) == 1:
            return self.cite(a, b, points[0])
        rows = self.table.loc[[(a, b, p) for p in points]]
        means = ", ".join(f"{m:+.2f}" for m in rows["mean_diff"])
        counts = "/".join(str(int(rows[c].sum())) for c in ("wins", "ties", "losses"))
        return (f"{a} - {b} at {named(points)}: {means}, intervals within [{rows['ci_low'].min():+.2f}, "
                f"{rows['ci_high'].max():+.2f}], {counts} seed-points")  # fmt: skip

    def within(self, keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], str]:
        """The verdicts of these rows with Holm's adjustment over them alone: a finding that reads a pair at some of
        its points (finding 1 at the blind points) is its own family, not the pair at every point."""
        part = self.table.loc[keys].reset_index()
        part["p_holm"] = holm(part["p_t"], pd.Series(0, index=part.index))
        return dict(zip(keys, rule_verdicts(part)["verdict"], strict=True))

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
    comparisons: pd.DataFrame,
    verdicts: pd.DataFrame,
    distances: pd.DataFrame,
    heads: pd.DataFrame,
    losses: pd.DataFrame | None = None,
) -> list[Finding]:
    """Each finding's verdict and evidence by the module's rules; ``heads``: ``summary.head_attribution``'s table;
    ``losses``: ``losses.compare_losses``'s. No verdict below ``MIN_SEEDS`` seeds: none at all where no pair has
    them, and none for a finding whose verdict would read otherwise without the setups that lack them."""
    found = _judged(comparisons, verdicts, distances, heads, losses)
    seeds = 0 if comparisons.empty else int(comparisons["seeds"].max())
    if seeds < MIN_SEEDS:  # a pilot or a grid's first parts: its rows are evidence, never a verdict
        few = "one seed" if seeds <= 1 else f"{seeds} seeds of the {MIN_SEEDS} a verdict needs"
        return [Finding(f.number, f.claim, f"no verdict: {few}", f.evidence) for f in found]
    short = comparisons[comparisons["seeds"] < MIN_SEEDS]
    if short.empty:
        return found
    # A grid done in parts has setups with fewer seeds than the rest: a finding whose verdict reads otherwise
    # without them rests on them, and gets none yet; the others stand (their rows still cite every setup).
    trained = set(distances["setup"])
    lacking = {setup: n for setup, n in short.groupby("setup_a")["seeds"].max().items() if setup in trained}
    kept = comparisons.index[comparisons["seeds"] >= MIN_SEEDS]
    enough = _judged(
        comparisons.loc[kept],
        verdicts.loc[kept],
        distances[~distances["setup"].isin(lacking)],
        heads[~heads["setup"].isin(lacking)] if not heads.empty else heads,
        None if losses is None else losses[losses["seeds"] >= MIN_SEEDS],
    )
    waiting = ", ".join(f"{setup} has {n} of the {MIN_SEEDS} seeds a verdict needs" for setup, n in lacking.items())
    return [f if f.verdict == g.verdict else Finding(f.number, f.claim, f"no verdict: {waiting}", f.evidence)
            for f, g in zip(found, enough, strict=True)]  # fmt: skip


def _judged(
    comparisons: pd.DataFrame,
    verdicts: pd.DataFrame,
    distances: pd.DataFrame,
    heads: pd.DataFrame,
    losses: pd.DataFrame | None,
) -> list[Finding]:
    rows, beyond = Rows(comparisons, verdicts), beyond_window(distances)
    setups = list(dict.fromkeys(distances["setup"]))
    return [
        _blindness(rows, beyond, distances, heads),
        _log_distances(rows, beyond, setups),
        _strong_baseline(rows, setups),
        _separable(rows, beyond),
        _benchmarks(losses),
    ]


@dataclass(frozen=True)
class BlindCarriers:
    """``blind_points``' answer: per setup its blind points (nearest first), its blind carriers (``l0h0``) and those
    of them blind already where they were ablated, and the evidence lines."""

    points: dict[str, list[str]]
    carriers: dict[str, list[str]]
    ablated_blind: dict[str, list[str]]
    evidence: list[str]


def blind_points(rows: Rows, distances: pd.DataFrame, heads: pd.DataFrame) -> BlindCarriers:
    """Per setup that recalls above the best constant answer in the window, its blind points (nearest first), and
    the evidence lines naming each carrier blind in most of its seeds. A point counts only where the zeros are
    underflow that float64 removes: some of the fact's weights exactly 0 in the training precision and none in the
    float64 re-score (a sliding window's masked keys are 0 in any dtype; where float64 keeps zeros too, the re-score
    is no zero-free test, and the point is named as such), or, not re-scored, where some are 0.

    A carrier is a head whose ablation at the answer's query, at the farthest in-window point (``EpisodeRecall``),
    costs recall; one whose fact weight is already exactly 0 there cannot be passing the fact at that point, so
    what its ablation costs is its work nearer than its blind distance: it is named as blind where ablated."""
    factors = sorted(distances["factor"].unique())
    window = distances["window"].iloc[0]
    inside = [f for f in factors if distance_point(f) not in beyond_window(distances)]
    ablated_at = inside[-1] * window if inside else None  # tokens: where EpisodeRecall ablates
    carriers = heads[heads["ablation_cost"] >= CARRIES] if not heads.empty else heads
    points: dict[str, list[str]] = {}
    blind_carriers: dict[str, list[str]] = {}
    ablated_blind: dict[str, list[str]] = {}
    evidence = []
    for setup in dict.fromkeys(distances["setup"]):
        if not inside or rows.verdict(setup, BASELINE, distance_point(inside[-1])) != "higher":
            continue
        own, mine = carriers[carriers["setup"] == setup], distances[distances["setup"] == setup]
        zeros = mine.groupby("factor")[["zeros", "zeros_zero_free"]].mean() if "zeros" in mine else None
        underflow = [f for f in factors if zeros is None or f not in zeros.index or (
            zeros.loc[f, "zeros"] > 0 and zeros.loc[f, "zeros_zero_free"] == 0
            if pd.notna(zeros.loc[f, "zeros_zero_free"]) else zeros.loc[f, "zeros"] > 0)]  # fmt: skip
        kept = [f for f in factors if zeros is not None and f in zeros.index and zeros.loc[f, "zeros_zero_free"] > 0]
        if kept:
            evidence.append(f"{setup}: float64 keeps exact zeros at {named([distance_point(f) for f in kept])} "
                            "(no zero-free test there)")  # fmt: skip
        for (layer, head), frame in own.groupby(["layer", "head"]):
            blind = frame["blind_by"].dropna()
            if not len(blind):
                continue
            first = float(blind.min()) / window
            if len(blind) * 2 > len(frame) and any(f >= first - 1e-9 for f in underflow):  # most seeds, underflow
                where = "inside the window" if first < 1 else "beyond the window"
                line = (f"{setup} l{layer}h{head} exactly blind by {named([distance_point(first)])} ({where}) "
                        f"in {len(blind)} of the {len(frame)} seeds it carries recall in")  # fmt: skip
                blind_carriers.setdefault(setup, []).append(f"l{layer}h{head}")
                if ablated_at is not None and float(blind.min()) <= ablated_at + 1e-9:
                    ablated_blind.setdefault(setup, []).append(f"l{layer}h{head}")
                    line += f", blind where it was ablated ({ablated_at:g} tokens)"
                evidence.append(line)
                at = [distance_point(f) for f in underflow if f >= first - 1e-9]
                points[setup] = sorted(set(points.get(setup, [])) | set(at), key=lambda p: float(p[8:-1]))
    return BlindCarriers(points, blind_carriers, ablated_blind, evidence)


def all_blind(distances: pd.DataFrame, points: dict[str, list[str]]) -> float | None:
    """The largest share of episodes in which every head that carries recall gives the fact exactly 0
    (``carriers_blind``, mean over seeds) at the given points of each setup; None where it was not measured."""
    if "carriers_blind" not in distances:
        return None
    at = distances.assign(point=distances["factor"].map(distance_point))
    chosen = pd.concat([at[(at["setup"] == s) & at["point"].isin(ps)] for s, ps in points.items()] or [at.iloc[:0]])
    shares = chosen.dropna(subset=["carriers_blind"]).groupby(["setup", "point"])["carriers_blind"].mean()
    return float(shares.max()) if len(shares) else None


def _blindness(rows: Rows, beyond: list[str], distances: pd.DataFrame, heads: pd.DataFrame) -> Finding:
    claim = "Blindness (exact zeros) can substantially impair token retrieval"
    found = blind_points(rows, distances, heads)
    blind, evidence = found.points, found.evidence
    setups = list(dict.fromkeys(distances["setup"]))
    shares = distances[distances["factor"].map(distance_point).isin(beyond)]
    factors = sorted(distances["factor"].unique())
    inside = [distance_point(f) for f in factors if distance_point(f) not in beyond]
    learned = [s for s in setups if inside and rows.verdict(s, BASELINE, inside[-1]) == "higher"]
    never = [s for s in setups if s not in learned and shares.loc[shares["setup"] == s, "blind_share"].max() > 0]
    untested = f"blind, but never above the best constant answer in the window: {', '.join(never) or 'none'}"
    trained = [
        (TRAINED_ZERO_FREE, REFERENCE, p) for p in blind.get(REFERENCE, [])
        if rows.verdict(TRAINED_ZERO_FREE, REFERENCE, p) is not None
    ]  # fmt: skip
    rescored = [(s + ZERO_FREE, s, p) for s, ps in blind.items() for p in ps if rows.verdict(s + ZERO_FREE, s, p)]
    small = [(s + FLOORED, s, p) for s, ps in blind.items() for p in ps if rows.verdict(s + FLOORED, s, p)]
    small += [
        (SMALL_WEIGHTS, REFERENCE, p) for p in blind.get(REFERENCE, []) if rows.verdict(SMALL_WEIGHTS, REFERENCE, p)
    ]
    capped = [(s + CAPPED, s, p) for s, ps in blind.items() for p in ps if rows.verdict(s + CAPPED, s, p)]
    cited = []
    for group in (trained, rescored, small, capped):
        for pair in dict.fromkeys((a, b) for a, b, _ in group):
            cited.append(rows.cite_all(*pair, [p for a, b, p in group if (a, b) == pair]))
    if not blind:
        if never:
            return Finding(1, claim, f"not testable here: blindness occurs only in setups that never recall "
                                     f"({', '.join(never)})", "; ".join([*evidence, untested]))  # fmt: skip
        return Finding(1, claim, "not tested: no head that carries recall goes exactly blind",
                       "; ".join([*evidence, untested]))  # fmt: skip
    deciding = trained or rescored
    if not deciding:
        return Finding(1, claim, "not tested: no zero-free arm", "; ".join([*evidence, *cited, untested]))
    higher = [row for row, verdict in rows.within(deciding).items() if verdict == "higher"]
    how = "trained without them (alibi_zero_free)" if trained else "re-scored without them (float64)"
    if higher:
        verdict = f"shown: {how}, recall is higher where carriers are exactly blind: " + ", ".join(
            f"{a} at {named([p])}" for a, _, p in higher
        )
    else:
        verdict = (f"not shown: {how}, recall is no higher at any of the {len(deciding)} points where carriers are "
                   "exactly blind")  # fmt: skip
        if not trained:
            verdict += (" (at evaluation alone, the expected answer: a weight of 1e-50 adds no more to a sum than 0 "
                        "does; whether the zeros stop learning needs the trained arm)")  # fmt: skip
        ceiling = rows.table.loc[deciding, "ci_high"].max()
        if pd.notna(ceiling):
            verdict += f"; the intervals exclude gains above {ceiling:+.2f}"
        together = all_blind(distances, {s: [p for _, plain, p in deciding if plain == s] for s in blind})
        if together == 0:
            verdict += ("; in no episode is every carrier blind at once (carriers_blind 0.00): another carrier "
                        "still sees the fact, so what is tested is a blind head beside one that sees")  # fmt: skip
        elif together is not None:
            verdict += f"; every carrier blind at once in at most {together:.2f} of the episodes there"
    if found.ablated_blind:
        heads_named = "; ".join(f"{s} {', '.join(hs)}" for s, hs in found.ablated_blind.items())
        verdict += (f"; carriers blind already where they were ablated ({heads_named}) carry work nearer than "
                    "their blind distance there, not the fact")  # fmt: skip
        if found.ablated_blind == found.carriers:
            verdict += ": no head seen to read the fact goes blind"
    return Finding(1, claim, verdict, "; ".join([*evidence, *cited, untested]))


def _log_distances(rows: Rows, beyond: list[str], setups: list[str]) -> Finding:
    claim = "Log-scaled distances give the most consistent improvement"
    tally = {
        s: (rows.points_where(s, REFERENCE, "higher", beyond), rows.points_where(s, REFERENCE, "lower", beyond))
        for s in setups
        if s != REFERENCE
    }
    if not any(s in LOG_DISTANCES for s in tally):
        return Finding(2, claim, "not tested: no log-distance setup ran", "")
    inside = {s: rows.points_where(s, REFERENCE, "lower", [p for a, b, p in rows.table.index
                                                            if (a, b) == (s, REFERENCE) and p not in beyond])
              for s in tally}  # fmt: skip
    evidence = "; ".join(
        f"{s} - {REFERENCE} beyond the window higher at {named(h)}, lower at {named(low)}"
        + (f" (in the window lower at {named(inside[s])})" if inside[s] else "")
        for s, (h, low) in tally.items()
        if s in LOG_DISTANCES or s in COMPONENTS
    )
    clean = {s: len(h) for s, (h, low) in tally.items() if not low and h}
    most = max(clean.values(), default=0)
    best = [s for s, n in clean.items() if n == most and s in LOG_DISTANCES]
    if LOG_DISTANCES[0] in best:
        cost = inside[LOG_DISTANCES[0]]
        return Finding(2, claim, "reproduces alone" + (f" beyond the window, where it is judged; in the window "
                                                       f"{LOG_DISTANCES[0]} is lower than ALiBi at {named(cost)}"
                                                       if cost else ""), evidence)  # fmt: skip
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
        missing = (
            "ALiBi did not run"
            if REFERENCE not in setups
            else f"no other slope scheme ({', '.join(SLOPE_SCHEMES)}) ran"
        )
        return Finding(3, claim, f"not tested: {missing}", "")
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


def _separable(rows: Rows, beyond: list[str]) -> Finding:
    claim = "These effects can be told apart from out-of-context degradation"
    parts, evidence = [], []
    regime = [(a, b, p) for a, b, p in rows.table.index if p == REGIME]
    for row in regime:
        verdict = rows.verdict(*row)
        evidence.append(rows.cite(*row))
        if verdict == "lower":
            parts.append("inside the window, ALiBi loses recall to NoPE beyond its first blind distance more than "
                         "inside it")  # fmt: skip
        elif verdict == "higher":
            parts.append("inside the window, ALiBi gains on NoPE beyond its first blind distance")
        else:
            parts.append("inside the window, ALiBi's recall against NoPE's is not shown to be lower beyond its first "
                         "blind distance than inside it (a tie is no equivalence: the interval is the evidence)")  # fmt: skip
    capped = [p for p in beyond if rows.verdict(REFERENCE + CAPPED, REFERENCE, p) is not None]
    if capped:
        restored = rows.points_where(REFERENCE + CAPPED, REFERENCE, "higher", capped)
        zeros = rows.points_where(REFERENCE + ZERO_FREE, REFERENCE, "higher", capped)
        small = rows.points_where(REFERENCE + FLOORED, REFERENCE, "higher", capped)
        for suffix in (CAPPED, ZERO_FREE, FLOORED):
            evidence += [rows.cite(REFERENCE + suffix, REFERENCE, p) for p in capped
                         if rows.verdict(REFERENCE + suffix, REFERENCE, p) is not None]  # fmt: skip
        tested = [name for suffix, name in ((ZERO_FREE, "zero-free"), (FLOORED, "floored"))
                  if any(rows.verdict(REFERENCE + suffix, REFERENCE, p) for p in capped)]  # fmt: skip
        if restored and tested and not zeros and not small:
            some = [f"{name} in {wins} of {seeds} at {named([p])}"
                    for suffix, name in ((ZERO_FREE, "zero-free"), (FLOORED, "floored")) for p in capped
                    for wins, seeds in [rows.wins(REFERENCE + suffix, REFERENCE, p)] if wins]  # fmt: skip
            parts.append(f"beyond the window, capping the bias restores ALiBi's recall at {named(restored)} while "
                         f"removing only its exact zeros or raising only its weights below a floor ({', '.join(tested)})"
                         " is not shown to restore it at any of them"
                         + (f" (higher in some seeds: {', '.join(some)})" if some else "")
                         + ": the loss there is not shown to be the zeros'; the cap changes every head's far bias, "
                         "blind or not, so which of its changes restores recall is not separated")  # fmt: skip
        elif restored:
            parts.append(f"beyond the window, capping the bias restores ALiBi's recall at {named(restored)}"
                         + (f"; without its zeros at {named(zeros)}" if zeros else "")
                         + (f"; without its smallest weights at {named(small)}" if small else ""))  # fmt: skip
        else:
            parts.append("beyond the window, capping the bias restores no recall")
    if not parts:
        return Finding(4, claim, "not tested: neither the paper's regime nor the evaluation-time interventions ran", "")
    return Finding(4, claim, "; ".join(parts), "; ".join(evidence))


def _benchmarks(losses: pd.DataFrame | None) -> Finding:
    claim = "Only a minor effect on standard benchmarks"
    if losses is None or losses.empty:
        return Finding(5, claim, "not tested: no held-out loss was measured", "")
    at = losses[losses["point"] == "1x"]
    if at.empty:
        return Finding(5, claim, "not tested: no held-out loss at the training length", "")

    def interval(row) -> str:
        return f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]" if pd.notna(row["ci_low"]) else "[one seed]"

    cite = {row["setup_a"]: f"{row['setup_a']} - {row['setup_b']} at 1x: {row['mean_diff']:+.3f} nats "
                            f"{interval(row)}, {row['wins']}/{row['ties']}/{row['losses']} seeds"
            for _, row in at.iterrows()}  # fmt: skip
    higher = [r["setup_a"] for _, r in at.iterrows() if r["ci_low"] > MINOR]
    lower = [r["setup_a"] for _, r in at.iterrows() if r["ci_high"] < -MINOR]
    wide = [r["setup_a"] for _, r in at.iterrows() if not minor(r) and r["setup_a"] not in higher + lower]
    stand = "held-out natural-text loss at the training length stands for the benchmarks"
    if higher or lower:
        verdict = (f"not reproduced: {len(higher) + len(lower)} of {len(at)} setups differ from ALiBi by more than "
                   f"{MINOR} nats (higher loss: {', '.join(higher) or 'none'}; lower: {', '.join(lower) or 'none'}; "
                   f"{stand})")  # fmt: skip
    elif wide:
        verdict = f"undecided: the intervals of {', '.join(wide)} reach beyond +-{MINOR} nats ({stand})"
    else:
        verdict = f"consistent: every setup's held-out loss lies within +-{MINOR} nats of ALiBi's ({stand})"
    return Finding(5, claim, verdict, "; ".join(cite.values()))


def findings_markdown(findings: list[Finding]) -> str:
    lines = [
        "| finding | verdict at this scale | evidence (rows of `comparisons.csv`, `losses.csv`) |",
        "|---|---|---|",
    ]
    lines += [f"| {f.number}. {f.claim} | {f.verdict} | {f.evidence or '-'} |" for f in findings]
    return "\n".join(lines) + "\n"


def write_findings(
    out: Path,
    comparisons: pd.DataFrame,
    verdicts: pd.DataFrame,
    distances: pd.DataFrame,
    heads: pd.DataFrame,
    losses: pd.DataFrame | None = None,
) -> list[Finding]:
    """``findings.md``: the table the results page and the README show; returns the findings."""
    rules = ("Rules: `blindheads/experiments/grid/findings.py`; intervals and verdicts: `comparisons.py` (recall) and "
             "`losses.py` (held-out loss).\n\n")  # fmt: skip
    found = judge(comparisons, verdicts, distances, heads, losses)
    (out / "findings.md").write_text(rules + findings_markdown(found))
    return found
