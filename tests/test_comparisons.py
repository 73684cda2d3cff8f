"""Paired comparisons: the interval's coverage, what pairing buys, the sign-flip p-value and a worked example from
the committed grid, each against a reference computed here (hand counts, a printed t table, exact enumeration)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from blindheads.experiments.grid.comparisons import (
    bootstrap_interval,
    compare,
    pairs,
    per_seed_recall,
    sign_flip_p,
    t_quantile,
    verdicts,
    write_comparisons,
)

TAIL_5_SEEDS = 0.5 * math.erfc(math.sqrt(5 / 4) * 2.776445 / math.sqrt(2))  # the expanded 95% tail, t[4] printed


def test_t_quantile_matches_the_printed_table():
    printed = {(0.975, 1): 12.7062, (0.975, 2): 4.3027, (0.975, 4): 2.7764, (0.975, 9): 2.2622, (0.995, 4): 4.6041}
    for (p, df), value in printed.items():
        assert t_quantile(p, df) == pytest.approx(value, abs=1e-4)


def test_sign_flip_p_equals_hand_enumeration():
    # 1..5 all positive: only all-plus and all-minus reach |15|: 2 of 32, the floor at 5 seeds
    assert sign_flip_p(np.array([1.0, 2, 3, 4, 5])) == 2 / 32
    # 1, 2, 3, 4, -5 sums to 5; flipping the subset S of {1..5} gives 15 - 2 sum(S), at least 5 away from 0 where
    # sum(S) <= 5 (subsets {}, 1, 2, 3, 12, 4, 13, 5, 14, 23: 10) or >= 10 (their complements: 10): 20 of 32
    assert sign_flip_p(np.array([1.0, 2, 3, 4, -5])) == 20 / 32
    assert sign_flip_p(np.array([0.25])) == 1.0 and sign_flip_p(np.array([0.1, -0.1])) == 1.0


def test_interval_covers_a_known_difference_at_its_rate():
    """5 seeds, a seed effect shared by both setups and a setup-by-seed effect larger than the episodes' noise:
    the true difference 0.05 is covered in at least 95% of 150 simulated grids (the interval is conservative),
    and not in all of them."""
    rng, seeds, episodes, cover = np.random.default_rng(0), 5, np.full(5, 64), 0
    for _ in range(150):
        b = 0.3 + 0.3 * rng.random(seeds)
        a = b + 0.05 + rng.uniform(-0.3, 0.3, seeds)  # mean over seeds' population: exactly 0.05
        low, high = bootstrap_interval(
            rng.binomial(episodes, a), episodes, rng.binomial(episodes, b), episodes, rng, 1000
        )
        cover += low <= 0.05 <= high
    assert 0.95 <= cover / 150 < 1


def test_pairing_narrows_the_interval_under_a_strong_seed_effect():
    """Recall from 0.06 to 0.81 by seed, setup a 8 episodes of 64 ahead in every seed: paired, the interval excludes
    0; resampling each setup's seeds on their own (the unpaired bootstrap, the same percentiles), it does not and
    is over 3x wider."""
    episodes, b = np.full(5, 64), np.array([4, 16, 28, 40, 52])
    paired = bootstrap_interval(b + 8, episodes, b, episodes, np.random.default_rng(0), 4000)
    rng = np.random.default_rng(0)
    means = [rng.binomial(64, c[rng.integers(0, 5, (4000, 5))] / 64).mean(axis=1) / 64 for c in (b + 8, b)]
    unpaired = np.quantile(means[0] - means[1], [TAIL_5_SEEDS, 1 - TAIL_5_SEEDS])
    assert paired[0] > 0 > unpaired[0]
    assert paired[1] - paired[0] < (unpaired[1] - unpaired[0]) / 3


def test_log_distance_against_alibi_at_8x_reproduces_by_hand_and_exact_enumeration():
    """An earlier grid at 8 windows: log distances 1, 0, 0, 1, 0 of 64 by seed, ALiBi 11, 7, 12, 29, 37. The
    bootstrap's distribution is enumerated exactly: every multiset of 5 seeds, the binomials convolved."""
    a, b = np.array([1, 0, 0, 1, 0]), np.array([11, 7, 12, 29, 37])
    table = pd.DataFrame(
        [{"setup": setup, "seed": seed, "point": "distance8x", "correct": int(counts[seed]), "episodes": 64}
         for setup, counts in (("log_distance", a), ("alibi", b)) for seed in range(5)]
    )  # fmt: skip
    row = compare(table, [("log_distance", "alibi")]).iloc[-1]
    assert row["point"] == "distance8x" and row["mean_diff"] == pytest.approx((2 - 96) / (5 * 64))
    assert (row["seeds"], row["wins"], row["ties"], row["losses"], row["p_sign_flip"]) == (5, 0, 0, 5, 2 / 32)

    def binomial(n, p):
        return np.array([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)])

    pmf = np.zeros(641)  # P(correct of a - correct of b = k - 320) over the 5 resampled seeds
    for chosen in itertools.combinations_with_replacement(range(5), 5):
        counts = np.bincount(chosen, minlength=5)
        weight = math.factorial(5) / math.prod(math.factorial(c) for c in counts) / 5**5
        of_a, of_b = np.ones(1), np.ones(1)
        for seed, count in enumerate(counts):
            of_a = np.convolve(of_a, binomial(64 * count, a[seed] / 64))
            of_b = np.convolve(of_b, binomial(64 * count, b[seed] / 64))
        pmf[320 - len(of_b) + 1 : 320 + len(of_a)] += weight * np.convolve(of_a, of_b[::-1])
    cdf, values = np.cumsum(pmf), (np.arange(641) - 320) / 320
    exact = values[np.searchsorted(cdf, TAIL_5_SEEDS)], values[np.searchsorted(cdf, 1 - TAIL_5_SEEDS)]
    assert exact == pytest.approx((-0.566, -0.097), abs=1e-3)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(exact, abs=0.01)
    assert verdicts(pd.DataFrame([row]))["verdict"].item() == "lower"


def test_records_give_counts_pairs_verdicts_and_baselines(tmp_path):
    """Shares of 8 episodes infer 8; a logged count wins. Against the reference and a named pair; a setup ahead in
    every seed is higher (8 seeds: with no spread the exact sign-flip p, 2/2^8, decides); one no better than the
    best constant answer is at baseline."""
    records = []
    for seed in range(8):
        for setup, correct in (("alibi", 2 + seed % 2), ("nope", 8), ("rope", 2 + seed % 2)):
            metrics = {
                "test/recall/distance2x/exact": correct / 8,
                "test/recall/distance2x/baseline": 2 / 8,
                "test/recall/distance0.5x/exact": 1.0,
                "test/recall/gap8/exact": 0.5,
                "test/recall/gap8/episodes": 6,
            }
            records.append({"setup": setup, "seed": seed, "metrics": metrics})
    table = per_seed_recall(records)
    assert list(dict.fromkeys(table["point"])) == ["distance0.5x", "distance2x", "gap8"]
    assert table.groupby("point")["episodes"].first().to_dict() == {"distance0.5x": 1, "distance2x": 8, "gap8": 6}
    assert pairs(["alibi", "nope", "rope"], named=[("nope", "rope"), ("nope", "x")]) == [
        ("nope", "alibi"),
        ("rope", "alibi"),
        ("nope", "rope"),
    ]
    assert pairs(["nope", "rope"]) == []
    write_comparisons(tmp_path, records, named=[("nope", "rope")])
    written = pd.read_csv(tmp_path / "verdicts.csv", keep_default_na=False).set_index(["setup_a", "setup_b", "point"])
    assert written.loc[("nope", "alibi", "distance2x"), "verdict"] == "higher"
    assert written.loc[("rope", "alibi", "distance2x"), "verdict"] == "no difference shown"
    assert written.loc[("nope", "rope", "distance2x"), "at_baseline"] == "rope"
    assert written.loc[("alibi", "baseline", "distance2x"), "at_baseline"] == "alibi"
    assert "| nope - alibi | +0.00 [+0.00, +0.00] 0/8/0 | **+0.69 [" in (tmp_path / "verdicts.md").read_text()


def test_recall_under_the_cap_is_compared_with_the_same_setup_uncapped_and_not_with_the_baseline(tmp_path):
    """A run's ``exact_capped`` enters as ``SETUP capped`` beside ``SETUP``: recall that returns under the cap in
    every seed is higher; the capped setup is not compared with ALiBi or with the best constant answer."""
    records = [
        {"setup": setup, "seed": seed, "metrics": {
            "test/recall/distance4x/exact": 0.25, "test/recall/distance4x/exact_capped": capped,
            "test/recall/distance4x/episodes": 64, "test/recall/distance4x/baseline": 0.125,
        }}
        for seed in range(8) for setup, capped in (("alibi", 0.75 + seed / 64), ("steep", 0.25))
    ]  # fmt: skip
    assert pairs(["alibi", "steep", "alibi capped", "steep capped"]) == [
        ("steep", "alibi"),
        ("alibi capped", "alibi"),
        ("steep capped", "steep"),
    ]
    write_comparisons(tmp_path, records)
    written = pd.read_csv(tmp_path / "verdicts.csv", keep_default_na=False).set_index(["setup_a", "setup_b", "point"])
    assert written.loc[("alibi capped", "alibi", "distance4x"), "verdict"] == "higher"
    assert written.loc[("steep capped", "steep", "distance4x"), "verdict"] == "no difference shown"
    assert {a for a, b, _ in written.index if b in ("alibi", "baseline")} == {"steep", "alibi capped", "alibi"}


def test_passkey_and_needle_are_compared_with_alibi_seed_by_seed_beside_the_paper(tmp_path):
    from blindheads.experiments.grid.retrieval_comparisons import write_retrieval

    auc = {
        "alibi": [0.9, 0.8, 0.85],
        "log_distance": [0.95, 0.9, 0.97],
        "nope": [0.9, 0.8, 0.85],
        "safe": [0.6, 0.49, 0.56],
    }
    runs = pd.DataFrame([
        {"setup": setup, "seed": seed, "passkey_auc_in": value, "passkey_auc_out": value / 2,
         "needle_auc_in": value, "needle_auc_out": 0.1}
        for setup, values in auc.items() for seed, value in enumerate(values)
    ])  # fmt: skip
    table = write_retrieval(tmp_path, runs).set_index(["setup", "metric"])
    row = table.loc[("log_distance", "passkey_auc_in")]
    differences = np.array([0.05, 0.10, 0.12])
    half = 4.302652729911275 * differences.std(ddof=1) / np.sqrt(3)  # Student's t, 2 degrees of freedom
    assert row["minus_alibi"] == pytest.approx(differences.mean())
    assert (row["low"], row["high"]) == pytest.approx((differences.mean() - half, differences.mean() + half))
    assert (row["wins"], row["losses"]) == (3, 0) and row["p"] == 0.25
    t = differences.mean() / (differences.std(ddof=1) / np.sqrt(3))
    assert row["p_t"] == pytest.approx(1 - t / np.sqrt(t**2 + 2))  # Student's t with 2 df, in closed form
    # Holm over log_distance's four AUCs: three share this p (the same relative differences), one is exactly 0 (p 1)
    assert row["p_holm"] == pytest.approx(min(1, 4 * row["p_t"])) and row["p_holm"] > 0.05
    assert row["verdict"] == "no difference shown", "the interval excludes 0, but not after Holm over four AUCs"
    safe = table.loc[("safe", "passkey_auc_in")]  # -0.30, -0.31, -0.29: consistent enough to survive Holm
    assert safe["p_holm"] < 0.05 and safe["verdict"] == "lower"
    assert table.loc[("nope", "passkey_auc_in"), "verdict"] == "no difference shown"  # identical: no interval above 0
    assert table.loc[("log_distance", "passkey_auc_out"), "paper"] == 0.77
    text = (tmp_path / "retrieval.md").read_text()
    assert "| log_distance | passkey_auc_out | 3 | 0.47 | 0.77 |" in text
    assert "cannot fall below 2 / 2^n (0.25 at the most seeds here, 3)" in text
    two = runs[runs["seed"] < 2].copy()
    two.loc[two["setup"] == "log_distance", "needle_auc_out"] = 0.3  # +0.2 in both seeds
    two = write_retrieval(tmp_path, two).set_index(["setup", "metric"]).loc[("log_distance", "needle_auc_out")]
    assert two["low"] == pytest.approx(0.2), "two equal differences: an interval of one point above 0"
    assert two["verdict"] == "none: 2 of 3 seeds" and (two["wins"], two["losses"]) == (2, 0)
    write_retrieval(tmp_path, runs[runs["seed"] == 0])  # one seed: a difference, no interval
    assert (
        "| log_distance | passkey_auc_in | 1 | 0.95 |  | +0.05 no interval (1 seed) | 1/0 | 1 | none: 1 of 3 seeds |"
        in (tmp_path / "retrieval.md").read_text()
    )
    assert write_retrieval(tmp_path, runs.drop(columns=["needle_auc_out"])) is None
    alone = write_retrieval(tmp_path, runs[runs["setup"] == "alibi"])  # a grid of ALiBi alone: its means, no verdicts
    assert list(alone["mean"]) == pytest.approx([0.85, 0.425, 0.85, 0.1]) and alone["verdict"].isna().all()
    assert "| alibi | passkey_auc_out | 3 | 0.43 | 0.08 |  |  |  |  |" in (tmp_path / "retrieval.md").read_text()


def test_t_test_p_matches_the_printed_table_and_holm_matches_a_hand_adjustment():
    from blindheads.experiments.grid.comparisons import holm, t_test_p

    # a mean whose t statistic is the printed 97.5% quantile of t[7] (2.3646) has two-sided p 0.05
    differences = np.array([1.0, -1, 1, -1, 1, -1, 1, -1]) + 2.364624 * np.std([1.0, -1] * 4, ddof=1) / np.sqrt(8)
    assert t_test_p(differences) == pytest.approx(0.05, abs=1e-5)
    assert t_test_p(np.zeros(8)) == 1.0 and math.isnan(t_test_p(np.ones(1)))
    assert t_test_p(np.full(8, 0.1)) == 2 / 2**8  # no spread: the exact sign-flip p, not the t limit 0
    p = pd.Series([0.01, 0.04, 0.03, 0.2, 0.01, np.nan])
    family = pd.Series(["a", "a", "a", "a", "b", "b"])
    # family a sorted: 0.01 x4 = 0.04, 0.03 x3 = 0.09, 0.04 x2 = 0.08 -> kept at 0.09, 0.2 x1 = 0.2
    expected = [0.04, 0.09, 0.09, 0.2, 0.01, np.nan]
    assert holm(p, family).tolist() == pytest.approx(expected, nan_ok=True)


def test_the_zeros_and_the_floor_enter_as_setups_compared_with_the_model_as_it_is():
    records = [
        {"setup": "alibi", "seed": seed, "metrics": {
            "test/recall/distance4x/exact": 0.5, "test/recall/distance4x/exact_zero_free": 0.5,
            "test/recall/distance4x/exact_floored": 0.5 + 0.01 * seed, "test/recall/distance4x/exact_capped": 0.9,
            "test/recall/distance4x/episodes": 256}}
        for seed in range(8)
    ]  # fmt: skip
    table = per_seed_recall(records)
    assert set(table["setup"]) == {"alibi", "alibi zero-free", "alibi floored", "alibi capped"}
    chosen = pairs(list(dict.fromkeys(table["setup"])))
    assert chosen == [("alibi zero-free", "alibi"), ("alibi floored", "alibi"), ("alibi capped", "alibi")]
    compared = compare(table, chosen, resamples=2000).set_index("setup_a")
    zero_free = compared.loc["alibi zero-free"]
    assert (zero_free["ties"], zero_free["p_t"], zero_free["family"]) == (8, 1.0, "alibi zero-free - alibi")
    assert verdicts(compared.reset_index()).set_index("setup_a").loc["alibi capped", "verdict"] == "higher"


def test_setups_that_kept_outcomes_on_the_same_episodes_are_resampled_episode_by_episode_together():
    """Per-episode outcomes on one episode set per seed: the interval redraws each seed's episodes once for both
    setups, as an explicit bootstrap over seeds and episode indices does, and is narrower than redrawing each
    setup's episodes independently (what records without outcomes get)."""
    rng = np.random.default_rng(3)
    records, explicit = [], []
    for seed in range(8):
        shared = rng.random(128) < 0.6
        a, b = shared.copy(), shared.copy()
        a[rng.choice(128, 6 + seed % 3, replace=False)] = True  # a answers a few more
        for setup, outcome in (("x", a), ("y", b)):
            metrics = {"test/recall/distance2x/exact": outcome.mean(), "test/recall/distance2x/episodes": 128}
            records.append({"setup": setup, "seed": seed, "metrics": metrics, "episode_sets": {"distance2x": f"s{seed}"},
                            "episode_outcomes": {"distance2x": {"exact": "".join("1" if o else "0" for o in outcome)}}})  # fmt: skip
        explicit.append(a.astype(float) - b.astype(float))
    row = compare(per_seed_recall(records), [("x", "y")], resamples=4000).iloc[0]
    assert row["paired"]
    seeds = rng.integers(0, 8, size=(4000, 8))
    episodes = rng.integers(0, 128, size=(4000, 8, 128))
    means = np.stack(explicit)[seeds[..., None], episodes].mean(axis=(1, 2))
    n = 8
    tail = 0.5 * math.erfc(math.sqrt(n / (n - 1)) * 2.3646 / math.sqrt(2))  # t(7) 97.5%: 2.3646
    reference = np.quantile(means, [tail, 1 - tail])
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(reference), abs=0.004)
    for record in records:
        record.pop("episode_sets")
    unpaired = compare(per_seed_recall(records), [("x", "y")], resamples=4000).iloc[0]
    assert not unpaired["paired"] and unpaired["mean_diff"] == row["mean_diff"]
    assert (unpaired["ci_high"] - unpaired["ci_low"]) > 2 * (row["ci_high"] - row["ci_low"])
