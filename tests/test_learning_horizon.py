"""The learning horizon's rule (results/learning_horizon/): each status from records built to meet or miss one
condition, paired at the episode level, and its rows rendered by the one template."""

import numpy as np
import pytest

from blindheads.experiments.grid.comparisons import write_comparisons
from blindheads.experiments.grid.learning_horizon import CONTROL, TREATMENT, judge, markdown, readers
from blindheads.experiments.grid.tables import recall_by_distance

POINTS = {0.25: 64, 0.90625: 232}  # window multiple -> tokens back; both inside the 256-token window
EPISODES = 256


def outcome(recall: float, seed: int, salt: int) -> np.ndarray:
    """``recall`` of the episodes answered, which ones drawn by seed and salt (shared salt: the same episodes)."""
    answered = np.zeros(EPISODES, dtype=bool)
    answered[np.random.default_rng([seed, salt]).permutation(EPISODES)[: round(recall * EPISODES)]] = True
    return answered


def records(gain_far: float, gain_near: float = 0.0, control_far: float = 0.5, control_near: float = 0.95,
            seeds: int = 8) -> list[dict]:  # fmt: skip
    """Per seed: the plain arm recalls ``control_near`` / ``control_far``; the gradient-only arm answers the same
    episodes plus ``gain`` of the episodes more (so the pair is paired, and differs by exactly the gain)."""
    out = []
    for seed in range(seeds):
        for setup in (CONTROL, TREATMENT):
            metrics, outcomes = {}, {}
            for factor, tokens in POINTS.items():
                plain = control_near if factor < 0.5 else control_far
                gain = (gain_near if factor < 0.5 else gain_far) * (setup == TREATMENT)
                answered = outcome(plain + gain, seed, 0)  # a superset of the plain arm's answers
                point = f"distance{factor:g}x"
                outcomes[point] = {"exact": "".join("1" if a else "0" for a in answered)}
                prefix = f"test/recall/{point}"
                metrics.update({f"{prefix}/exact": answered.mean(), f"{prefix}/episodes": EPISODES,
                                f"{prefix}/distance": tokens, f"{prefix}/length": 256, f"{prefix}/baseline": 0.15,
                                f"{prefix}/weight/layer0/head15": 0.2,
                                f"{prefix}/weight/layer0/head14": 0.02 if setup == TREATMENT else 0.001})  # fmt: skip
            out.append({"setup": setup, "seed": seed, "metrics": metrics, "episode_outcomes": outcomes,
                        "episode_sets": {p: f"{p}-seed{seed}" for p in outcomes}})  # fmt: skip
    return out


def verdict(tmp_path, runs):
    comparisons, _ = write_comparisons(tmp_path, runs)
    return judge(comparisons, recall_by_distance(runs), runs)


@pytest.mark.parametrize(
    ("gain_far", "gain_near", "control_far", "status"),
    [
        (0.10, 0.0, 0.5, "cost"),  # far gain in every seed, near tie
        (0.10, 0.05, 0.5, "undecided"),  # the floor also changes the near point: not the far fact alone
        (0.0, 0.0, 0.5, "no cost"),  # a tie with room to gain
        (0.0, 0.0, 0.9, "undecided"),  # a tie at ceiling decides nothing
    ],
)
def test_each_status_follows_its_rule(tmp_path, gain_far, gain_near, control_far, status):
    found = verdict(tmp_path, records(gain_far, gain_near, control_far))
    assert found.status == status, found.reason
    assert found.far == "distance0.90625x" and found.near == "distance0.25x"
    assert found.rows["paired"].all()  # the same episodes per seed: compared episode by episode


def test_a_control_that_does_not_learn_decides_nothing(tmp_path):
    found = verdict(tmp_path, records(0.10, control_far=0.1, control_near=0.15))
    assert found.status == "not decidable" and "not above the best constant answer" in found.reason


def test_one_arm_alone_is_not_tested(tmp_path):
    runs = [r for r in records(0.1) if r["setup"] == CONTROL]
    comparisons, _ = write_comparisons(tmp_path, runs)
    assert judge(comparisons, recall_by_distance(runs), runs).status == "not tested"


def test_readers_count_heads_whose_absolute_fact_weight_reaches_one_percent_and_the_template_shows_them(tmp_path):
    runs = records(0.10)
    counted = readers(runs).set_index(["setup", "point"])["readers"]
    assert counted[(CONTROL, "distance0.90625x")] == 1 and counted[(TREATMENT, "distance0.90625x")] == 2
    text = markdown(verdict(tmp_path, runs))
    assert text.startswith("**small weights cost learning")
    assert "| 0.90625x | +0.102 |" in text and "| alibi_gradient_floor | 2.0 | 2.0 |" in text
    assert "| 0 | 0.949 | 0.500 | 0.949 | 0.602 |" in text  # per seed: alibi near, far, then the floor's
