"""ALiBi slope schemes against the original implementation and transformers' BLOOM and MPT."""

import math

import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from blindheads.modules.position import ALiBi, build_position
from blindheads.modules.position.slopes import mpt_slopes, press_slopes, resolve_slopes
from blindheads.numerics import tau


def original_alibi_slopes(n):
    """Press et al.'s ``get_slopes``, as in the original fairseq implementation."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest) + original_alibi_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", range(1, 65))
def test_press_slopes_equal_original_and_bloom(heads):
    ours = press_slopes(heads)
    torch.testing.assert_close(
        ours, torch.tensor(original_alibi_slopes(heads), dtype=torch.float64), rtol=1e-12, atol=0
    )
    bloom = build_alibi_tensor(torch.ones(1, 2), heads, torch.float32)[:, 0, 1]  # key position 1 -> the slope
    torch.testing.assert_close(ours.float(), bloom)


@pytest.mark.parametrize("heads", [1, 3, 7, 8, 12, 16, 32, 40, 71])
@pytest.mark.parametrize("bias_max", [8.0, 12.0])
def test_mpt_slopes_equal_transformers(heads, bias_max):
    mpt = build_mpt_alibi_tensor(heads, 2, alibi_bias_max=bias_max)[:, 0, 0]  # key at distance 1 -> -slope
    torch.testing.assert_close(mpt_slopes(heads, bias_max).float(), -mpt)


def test_mpt_default_bias_max_gives_press_slopes_for_powers_of_two():
    torch.testing.assert_close(mpt_slopes(16), press_slopes(16))


@pytest.mark.parametrize(
    "scheme, low, high",
    [("steep", 128, 512), ("safe", 2048, 4096), ("wide", 16, 4096), ("robust", 2048 / 9, 2048)],
)
def test_presets_place_blindness_distances(scheme, low, high):
    slopes = resolve_slopes(scheme, 9, 2048)
    distances = tau("bfloat16") / slopes
    torch.testing.assert_close(distances[[0, -1]], torch.tensor([low, high], dtype=torch.float64))
    assert (distances.diff() > 0).all(), "head 0 must be the steepest"


def test_wide_uses_powers_of_two():
    distances = tau("bfloat16") / resolve_slopes("wide", 9, 2048)
    torch.testing.assert_close(distances, 2.0 ** torch.arange(4, 13, dtype=torch.float64))


def test_robust_spreads_evenly_over_the_context():
    distances = tau("bfloat16") / resolve_slopes("robust", 4, 1024)
    torch.testing.assert_close(distances, torch.tensor([256.0, 512.0, 768.0, 1024.0], dtype=torch.float64))


def test_blind_distances_scheme_follows_dtype_and_threshold():
    slopes = resolve_slopes("press", 2, 64, blind_distances=[10.0, 20.0], dtype="float16", threshold="subnormal")
    torch.testing.assert_close(slopes, tau("float16", "subnormal") / torch.tensor([10.0, 20.0], dtype=torch.float64))


def test_explicit_and_learnable_slopes():
    alibi = ALiBi([0.5, 0.25], num_heads=2, learnable=True)
    torch.testing.assert_close(alibi.slopes, torch.tensor([0.5, 0.25]))
    (alibi.bias(torch.tensor(3.0), torch.arange(2)).sum()).backward()
    assert alibi.log_slopes.grad is not None and (alibi.log_slopes.grad != 0).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"slopes": [0.5, -0.25]}, "must be positive"),
        ({"slopes": [0.5, 0.0]}, "must be positive"),
        ({"slopes": [0.5]}, "1 slopes for 2 heads"),
        ({"slopes": "steeep"}, "valid: press, mpt, steep, safe, wide, robust"),
        ({"blind_distances": [10.0, -1.0]}, "must be positive"),
        ({"dtype": "int8", "slopes": "safe"}, "valid: float64, float32, bfloat16, float16"),
        ({"threshold": "denormal", "slopes": "safe"}, "valid: normal, subnormal"),
    ],
)
def test_bad_slopes_name_the_value_and_the_choices(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ALiBi(num_heads=2, **kwargs)


def test_alibi_from_spec_uses_the_model_heads():
    stack = build_position("alibi(mpt, alibi_bias_max=16)", num_heads=12, context_length=512)
    torch.testing.assert_close(stack.components[0].slopes, mpt_slopes(12, 16).float())


def test_a_component_named_twice_is_refused():
    from blindheads.modules.position.registry import build_position

    with pytest.raises(ValueError, match=r"names alibi twice; a stack takes each component once"):
        build_position("alibi+alibi", 8, 256)


def test_a_scale_multiplies_the_press_slopes_and_is_refused_where_it_would_mean_nothing():
    """``alibi(scale=16)``: 16 heads' slopes 2^(3.5 - k/2), Press's x 16 by the formula; a scale beside the blind
    distances that choose the slopes, or one that is no positive finite number, is refused naming it."""

    slopes = build_position("alibi(scale=16)", 16, 256, "float32", "normal").components[0].slopes
    expected = torch.tensor([2 ** (3.5 - k / 2) for k in range(16)], dtype=torch.float32)
    assert torch.equal(slopes, expected)
    for spec, message in (("alibi(scale=0)", "scale must be > 0"), ("alibi(scale=-2)", "scale must be > 0"),
                          ("alibi(blind_distances=[10, 20], scale=2)", "would move the blind distances")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            build_position(spec, 2, 256, "float32", "normal")
