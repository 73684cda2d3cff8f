"""Attribution by head: the bias cap against a hand-computed row and against a clamp at the capped bias, the ablation
against the model's own parts, the carriers' classes, EpisodeRecall's columns; and the dense_recall clamp floors,
which bind where the defaults never did."""

import math

import pytest
import torch
from support.data import builtin_data
from support.models import cpu_trainer, tiny_lm
from support.runs import REPO

from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.datamodules.retrieval_mix import RetrievalMix
from blindheads.evaluation.attribution import ablated, capped_bias, carrier_classes
from blindheads.experiments.grid.setups import position_of, setup_files
from blindheads.modules.config import DecoderConfig
from blindheads.modules.decoder import Decoder
from blindheads.modules.position import build_position

RECALL_BY_DISTANCE = [
    str(REPO / f"configs/experiments/{n}.yaml") for n in ("laptop", "dense_recall", "recall_by_distance")
]


def decoder(position: str, heads: int = 4, layers: int = 2) -> Decoder:
    config = DecoderConfig.from_preset(
        "tiny", vocab_size=64, attention="sdpa", dtype="float32", position=position, num_layers=layers,
        num_heads=heads, num_kv_heads=heads,
    )  # fmt: skip
    return Decoder(config).eval()


def test_under_the_cap_each_heads_bias_row_holds_its_value_at_the_cap_and_is_restored_after():
    model = decoder("alibi")
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])[:, None]  # Press, 4 heads: r = 2^-2
    distance = torch.arange(29, -1, -1.0)  # the last query's row of 30 keys
    with capped_bias(model, 10):
        capped = model.position.dense_bias(1, 30, torch.device("cpu"))[:, 0]
    assert torch.equal(capped, -slopes * distance.clamp_max(10))
    assert torch.equal(model.position.dense_bias(1, 30, torch.device("cpu"))[:, 0], -slopes * distance)


@torch.no_grad()
def test_a_capped_model_computes_what_its_weights_compute_under_a_clamp_at_the_capped_bias():
    torch.manual_seed(0)
    capped, clamped = decoder("alibi([0.5])", heads=1), decoder("alibi([0.5])+clamp(floor=-5.0)", heads=1)
    clamped.load_state_dict(capped.state_dict())  # one head of slope 1/2 capped at 10 tokens: a floor at -5
    tokens = torch.randint(0, 64, (2, 40))
    plain = capped(tokens)  # fills the SDPA bias cache, which the cap must not read
    with capped_bias(capped, 10):
        held = capped(tokens)
    torch.testing.assert_close(held, clamped(tokens))
    assert (held - plain).abs().max() > 1e-3
    torch.testing.assert_close(capped(tokens), plain)


@torch.no_grad()
def test_ablating_the_only_head_at_a_query_leaves_that_position_its_own_token_through_the_mlp():
    torch.manual_seed(0)
    model, rows = decoder("alibi", heads=1, layers=1), torch.arange(2)
    tokens, queries = torch.randint(0, 64, (2, 12)), torch.tensor([5, 9])
    plain = model.hidden_states(tokens)
    with ablated(model, 0, 0, queries):
        hidden = model.hidden_states(tokens)
    block, x = model.blocks[0], model.embed(tokens[rows, queries])
    torch.testing.assert_close(hidden[rows, queries], model.norm(x + block.mlp(block.mlp_norm(x))))
    assert not torch.allclose(plain[rows, queries], hidden[rows, queries])
    torch.testing.assert_close(hidden[0, :5], plain[0, :5])  # one layer: only the ablated position changes
    torch.testing.assert_close(hidden[0, 6:], plain[0, 6:])


def test_episodes_are_classed_by_the_carriers_weights_alone():
    weights = torch.tensor([[[0.0, 0.5]], [[1e-7, 0.5]], [[0.0, 0.0]], [[1e-3, 0.0]]])  # (episodes, 1 layer, 2 heads)
    classes = carrier_classes(weights, torch.tensor([[True, False]]))
    assert classes["blind"].tolist() == [True, False, True, False]  # head 1's weight does not count
    assert classes["near_blind"].tolist() == [False, True, False, False]
    assert classes["reachable"].tolist() == [False, False, False, True]
    with pytest.raises(ValueError, match="no head carries"):
        carrier_classes(weights, torch.zeros(1, 2, dtype=torch.bool))


@pytest.mark.parametrize("position", ["nope", "alibi"])
def test_episode_recall_reports_each_heads_ablation_cost_and_the_capped_recall_beyond_the_window(
    cache_dir, position, monkeypatch
):
    from blindheads.callbacks import episode_recall

    recall = EpisodeRecall(every_n_steps=None, gaps=[], distances=[0.5, 2], samples=4, batch_size=4, attribution=True)
    data = builtin_data(cache_dir, 64, 2, 2, retrieval_mix=RetrievalMix(facts=1, value_digits=(1, 1), max_gap=16))
    model = tiny_lm({"warmup_steps": 1}, dtype="float32", context_length=64, position=position)
    trainer = cpu_trainer(max_steps=1, callbacks=[recall])
    trainer.fit(model, datamodule=data)
    figures = {}
    monkeypatch.setattr(episode_recall, "log_figures", lambda trainer, module, built: figures.update(built))
    scalars = recall.evaluate(trainer, model)
    axis = figures["recall/by_distance"](0).axes[0]
    lines = {line.get_label(): line for line in axis.get_lines()}
    # recall against distance as TensorBoard's image: each measure the points have, the window marked
    assert list(lines["exact recall"].get_xdata()) == [32, 128]
    assert list(lines["exact recall"].get_ydata()) == [scalars[f"recall/distance{f}x/exact"] for f in (0.5, 2)]
    assert ("bias capped" in lines) == (position == "alibi") and "no exact zeros (float64)" not in lines
    assert list(lines["bias capped" if position == "alibi" else "exact recall"].get_xdata())[-1] == 128
    assert any(list(line.get_xdata()) == [64, 64] for line in axis.get_lines()), "the window marked"
    costs = [v for k, v in scalars.items() if k.startswith("recall/heads/") and k.endswith("/ablation_cost")]
    assert len(costs) == 2 * 4 and all(-1 <= c <= 1 for c in costs)
    assert scalars["recall/heads/ablation_distance"] == 32
    assert scalars["recall/heads/carriers"] == sum(c >= 0.05 for c in costs)
    assert "recall/distance0.5x/exact_capped" not in scalars  # in the window the cap changes nothing
    if position == "nope":  # no bias to cap
        assert not any(k.endswith("exact_capped") for k in scalars)
    else:
        assert scalars["recall/distance2x/exact_capped"] in (0, 0.25, 0.5, 0.75, 1)  # 4 episodes


@pytest.mark.parametrize(
    ("setup", "without", "floor"), [("clamp", "alibi", -16.0), ("clamp_log_distance", "log_distance", -1.75)]
)
def test_at_the_recall_by_distance_settings_the_clamp_binds_in_the_window_and_at_2x(setup, without, floor):
    """Head 0 (slope 1/2) at 63 tokens (the farthest key of training) and at 128 (2x): the laptop grid's clamp floor
    binds in both; the default floor, -75.2 at 64 tokens in float32, bound in neither."""

    def head0_bias(spec: str) -> list[float]:
        stack = build_position(spec, num_heads=8, context_length=64, dtype="float32", threshold="normal")
        return stack.bias_of_distance(torch.tensor([63.0, 128.0]), torch.tensor(0)).tolist()

    clamped = position_of(setup_files(setup, RECALL_BY_DISTANCE))
    plain = position_of(setup_files(without, RECALL_BY_DISTANCE))
    log = "log" in setup
    expected = [-0.5 * (math.log1p(d) if log else d) for d in (63, 128)]  # by hand: -m * d, or -m * ln(1 + d)
    assert head0_bias(plain) == pytest.approx(expected, rel=1e-6)
    assert head0_bias(clamped) == [floor, floor]
    default = position_of(setup_files(setup, RECALL_BY_DISTANCE[:1]))
    assert head0_bias(default) == pytest.approx(expected, rel=1e-6)
