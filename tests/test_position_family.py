"""The additive-bias family (KERPLE log and power, T5 buckets, FIRE) against independent references, and the one
contract every bias follows: a new bias is a class with a name, and the calculator answers for it by its inverse,
by bisection when it is monotone, or by a scan when it is not."""

import math

import pytest
import torch
from support.backends import eager_and_sdpa_agree, flex_matches_sdpa
from support.softmax import CASES, reference_zero_mask
from torch import nn
from transformers.models.t5.modeling_t5 import T5Attention

from blindheads.blindness import (
    bias_only_logits,
    blind_distances,
    blind_keys,
    blindness_report,
    effective_tau,
    first_blind_key,
)
from blindheads.callbacks.gradient_blindness import trained_behind
from blindheads.modules.position import COMPONENTS, PositionComponent, build_position
from blindheads.numerics import tau

FAMILY = ["kerple_log", "kerple_power", "t5_buckets", "fire"]


@pytest.fixture
def new_biases():
    """Two biases a user might add, each a class whose ``name`` registers it; unregistered afterwards, so the other
    tests see only the builtin components."""

    class Dip(PositionComponent):
        """Falls gently but dips far below tau at distances 10..19, as a learned table can."""

        name = "dip"
        monotone = False

        def bias(self, d, h):
            return torch.where((d >= 10) & (d < 20), torch.full_like(d, -200.0), -0.01 * d)

    class Quadratic(PositionComponent):
        """Monotone, with no inverse: ``-a * d^2``."""

        name = "quadratic"

        def __init__(self, a: float = 0.01) -> None:
            super().__init__()
            self.a = a

        def bias(self, d, h):
            return -self.a * d * d

    yield
    for cls in (Dip, Quadratic):
        COMPONENTS.pop(cls.name)


def test_a_new_bias_is_one_class_and_the_calculator_bisects_it(new_biases):
    stack = build_position("quadratic(a=0.04)+sliding_window(4096)", num_heads=3, context_length=64)
    t = tau("float32")
    torch.testing.assert_close(blind_distances(stack, t), torch.full((3,), math.sqrt(t / 0.04), dtype=torch.float64))
    report = blindness_report(stack, 64, "float32", "normal")  # what the underflow monitor asks at test time
    assert report.monotone and report.heads[0].blind_distance == pytest.approx(math.sqrt(t / 0.04))
    yaml_entry = build_position([{"quadratic": {"a": 0.04}}], num_heads=3, context_length=64)
    torch.testing.assert_close(
        yaml_entry.dense_bias(1, 64, "cpu"),
        build_position("quadratic(a=0.04)", 3, 64).dense_bias(1, 64, "cpu"),
    )


def test_a_name_cannot_be_taken_twice():
    with pytest.raises(ValueError, match="position component name 'alibi' is taken by .*ALiBi; choose another"):
        type("MyALiBi", (PositionComponent,), {"name": "alibi"})


def test_a_bias_with_a_dip_gets_the_first_exact_zero_of_a_real_softmax(new_biases):
    """Bisection, which assumes the bias only falls, would miss the dip and answer where -0.01 d reaches -tau (about
    10,000 tokens, beyond the context); the scan finds the dip, where torch.softmax of the bias row is exactly zero."""
    context = 256
    stack = build_position("dip", num_heads=2, context_length=context)
    weights = torch.softmax(stack.dense_bias(1, context, "cpu")[:, 0].float(), dim=-1).flip(-1)  # by distance
    zero = weights[0] == 0
    assert zero[10:20].all() and not zero[:10].any() and not zero[20:].any()
    report = blindness_report(stack, context, "float32", "subnormal", "materialized")
    assert not report.monotone
    assert [h.blind_distance for h in report.heads] == [10.0, 10.0]  # the first zero, though keys beyond it are seen
    assert report.heads[0].underflow_last_query == zero.sum().item() / context
    pairs = sum(context - d for d in range(10, 20)) / (context * (context + 1) / 2)
    assert report.heads[0].underflow_all_pairs == pytest.approx(pairs)
    assert blind_distances(stack, tau("float32", "subnormal"), search=True, context=context).tolist() == [10.0, 10.0]
    with pytest.raises(ValueError, match="may rise with distance is scanned: give the context length"):
        blind_distances(stack, tau("float32"))


def test_t5_buckets_equal_transformers():
    d = torch.arange(0, 5000)
    for buckets, max_distance in [(32, 128), (64, 1024), (8, 20)]:
        stack = build_position(f"t5_buckets({buckets}, {max_distance})", num_heads=2, context_length=128)
        theirs = T5Attention._relative_position_bucket(
            -d, bidirectional=False, num_buckets=buckets, max_distance=max_distance
        )
        for dtype in (torch.float32, torch.float64):  # the backends' distances, and the calculator's
            assert torch.equal(stack.components[0].bucket(d.to(dtype)), theirs), (buckets, max_distance, dtype)


def test_kerple_biases_and_blind_distances_by_hand():
    r1, r2 = [20.0, 1.0], [1.0, 0.5]
    d = torch.arange(300, dtype=torch.float64)
    log = build_position(f"kerple_log(r1={r1}, r2={r2})", num_heads=2, context_length=300)
    power = build_position(f"kerple_power(r1={r1}, r2=[1.5, 0.5])", num_heads=2, context_length=300)
    row = lambda stack: stack.dense_bias(1, 300, "cpu")[:, 0].flip(-1).double()  # noqa: E731
    torch.testing.assert_close(row(log)[0], -20 * torch.log(1 + d), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(row(log)[1], -1 * torch.log(1 + 0.5 * d), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(row(power)[0], -20 * d**1.5, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(row(power)[1], -1 * d**0.5, rtol=1e-6, atol=1e-5)
    t = tau("bfloat16")
    by_hand = {log: [math.expm1(t / 20), math.expm1(t / 1) / 0.5], power: [(t / 20) ** (1 / 1.5), (t / 1) ** 2]}
    for stack, want in by_hand.items():
        want = torch.tensor(want, dtype=torch.float64)
        torch.testing.assert_close(blind_distances(stack, t), want, rtol=1e-9, atol=0)  # closed form
        torch.testing.assert_close(blind_distances(stack, t, search=True), want, rtol=1e-9, atol=0)  # bisection


def test_kerple_refuses_parameters_out_of_range():
    with pytest.raises(ValueError, match=r"kerple_power r2 must be at most 2.0, got \[2.5, 1.0\]"):
        build_position("kerple_power(r1=[1, 1], r2=[2.5, 1])", num_heads=2, context_length=64)
    with pytest.raises(ValueError, match=r"kerple_log r1 takes 2 positive values \(one per head\), got \[1, -1\]"):
        build_position("kerple_log(r1=[1, -1])", num_heads=2, context_length=64)


class PaperFIRE(nn.Module):
    """FIRE as the appendix of Li et al. (2023) writes it in PyTorch, for all query positions at once."""

    def __init__(self, num_heads, mlp_width=32, init_c=0.1, init_L=512.0, eps=1e-6):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, num_heads))
        self.c = nn.Parameter(torch.tensor(init_c))
        self.init_L = nn.Parameter(torch.tensor(init_L), requires_grad=False)
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.eps = eps

    def forward(self, seq_length):
        positions = torch.arange(seq_length, dtype=torch.float)
        rel_distance = positions[:, None] - positions[None, :]
        threshold = torch.abs(self.L_multiplier * self.init_L)
        pos_normalizer = torch.max(positions, threshold)[:, None]
        rel_distance = torch.log(torch.abs(self.c * rel_distance) + 1)
        pos_normalizer = torch.log(torch.abs(self.c * pos_normalizer) + 1) + self.eps
        return self.mlp((rel_distance / pos_normalizer).unsqueeze(-1)).permute(2, 0, 1)  # (heads, q, k)


@pytest.mark.parametrize("min_length", [512.0, 16.0])  # the threshold above and below the query positions
def test_fire_equals_the_papers_code(min_length):
    stack = build_position(f"fire(min_length={min_length})", num_heads=3, context_length=96)
    fire, paper = stack.components[0], PaperFIRE(3, init_L=min_length)
    with torch.no_grad():
        paper.mlp[0].weight.copy_(fire.hidden_weight[:, None])
        paper.mlp[0].bias.copy_(fire.hidden_bias)
        paper.mlp[2].weight.copy_(fire.out_weight)
        paper.mlp[2].bias.copy_(fire.out_bias)
        causal = torch.ones(96, 96).tril().bool()
        ours, theirs = stack.dense_bias(96, 96, "cpu"), paper(96)
    torch.testing.assert_close(ours[:, causal], theirs[:, causal], rtol=1e-5, atol=1e-5)
    assert stack.query_dependent and not stack.monotone


@pytest.mark.parametrize("spec", FAMILY)
def test_eager_and_sdpa_agree_and_gradients_reach_the_bias_parameters(spec):
    grads = eager_and_sdpa_agree(spec)
    position = [name for name in grads if name.startswith("position.")]
    assert position
    for name in position:
        assert grads[name].abs().sum() > 0, f"no gradient reaches {name}"


@pytest.mark.slow  # compiles FlexAttention once per member
@pytest.mark.parametrize("spec", FAMILY)
def test_compiled_flex_matches_sdpa(spec):
    flex_matches_sdpa(spec)


def blinding(spec: str, context: int):
    """A 4-head stack of ``spec`` whose parameters put some heads' first zero inside ``context`` and leave others
    sighted (the initial parameters are sighted in float32 and bfloat16)."""
    stack = build_position(
        {
            "kerple_log": "kerple_log(r1=[20, 10, 5, 1], r2=[1, 1, 0.5, 1])",
            "kerple_power": "kerple_power(r1=[1, 0.5, 0.1, 0.01], r2=[1.5, 1, 0.5, 2])",
        }.get(spec, spec),
        num_heads=4,
        context_length=context,
    )
    c = stack.components[0]
    with torch.no_grad():
        if spec == "t5_buckets":  # a dip at buckets 12..14, the last bucket (128 tokens on) low, none, a far dip
            c.table.zero_()
            c.table[0, 12:15], c.table[1, -1], c.table[3, 20] = -100.0, -95.0, -120.0
        if spec == "fire":  # one hidden unit passing its input: bias = -a_h * x, x the normalised log distance
            c.hidden_weight.zero_(), c.hidden_bias.zero_(), c.out_weight.zero_(), c.out_bias.zero_()
            c.hidden_weight[0] = 1.0
            c.out_weight[:, 0] = torch.tensor([-200.0, -120.0, -90.0, -10.0])
    return stack


@pytest.mark.parametrize("softmax", ["fused", "materialized"])
@pytest.mark.parametrize("dtype, threshold", CASES)
@pytest.mark.parametrize("spec", FAMILY)
def test_the_calculator_finds_the_zeros_of_real_softmaxes_in_every_dtype(spec, dtype, threshold, softmax):
    """Key by key, the calculator's verdict on the last query's row equals the real softmax's, but for keys whose
    bias lies within a quarter nat of the edge, where the dtype's rounding decides (a flat FIRE bias puts several
    keys there). Closed form for KERPLE, the scan for T5 and FIRE."""
    context = 2048
    stack = blinding(spec, context)
    reference = reference_zero_mask(stack, context, dtype, threshold, softmax).flip(-1)  # by distance
    report = blindness_report(stack, context, dtype, threshold, softmax)
    distances = torch.tensor([h.blind_distance for h in report.heads], dtype=torch.float64)
    edge_tau = effective_tau(stack, context, dtype, threshold, softmax)
    d = torch.arange(context, dtype=torch.float64)
    predicted = d >= torch.ceil(distances)[:, None] if stack.monotone else blind_keys(stack, edge_tau, context)
    on_the_edge = (bias_only_logits(stack, d, query=context - 1) + edge_tau[:, None]).abs() <= 0.25
    assert not reference.all() and (reference.any() or dtype == "float64"), "some keys blind (tau 708: none)"
    assert not ((predicted != reference) & ~on_the_edge).any()
    if not stack.monotone:  # the report's distance is the scan's first blind key
        torch.testing.assert_close(first_blind_key(predicted), distances)
    shares = torch.tensor([h.underflow_last_query for h in report.heads], dtype=torch.float64)
    torch.testing.assert_close(shares, predicted.double().mean(-1))


def test_monitors_find_the_trained_parameter_behind_each_head_parameter():
    """What ``GradientBlindness`` differentiates and ``EpisodeRecall`` logs, with no duck typing on slopes."""
    behind = {
        "alibi(learnable=True)": {"slope": "log_slopes"},
        "kerple_log": {"r1": "raw_r1", "r2": "raw_r2"},
        "kerple_power(learnable=False)": {},
        "t5_buckets": {"table": "table"},
        "fire": {"out_weight": "out_weight", "out_bias": "out_bias"},
        "alibi": {},
    }
    for spec, want in behind.items():
        stack = build_position(spec, num_heads=4, context_length=64)
        names = {id(p): name.rpartition(".")[2] for name, p in stack.named_parameters()}
        assert {k: names[id(p)] for k, p in trained_behind(stack).items()} == want, spec
        assert set(stack.learned_head_parameters()) == set(want), spec
