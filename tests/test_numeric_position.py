"""Every number a position component reads is finite in the dtypes it is used in: float32, where the bias is computed
and the components keep their numbers, and the training dtype. ``1e39`` is a finite Python float but ``inf`` as a
float32 slope, and a slope of ``inf`` makes the bias at the key itself ``-inf * 0 = nan``: refused where it is read,
so the calculator and ``fit`` both refuse it in one line."""

import math

import numpy as np
import pytest
import torch
from support.runs import refusal, tiny_run_args

from blindheads.modules.position import build_position
from blindheads.modules.position.base import not_finite_in


def builds(spec: str, dtype: str = "float32", heads: int = 2) -> bool:
    """Whether ``spec`` builds; a refusal must be a ``ValueError`` (any other exception fails the test)."""
    try:
        build_position(spec, heads, 64, dtype)
    except ValueError:
        return False
    return True


FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT16_MAX = float(np.finfo(np.float16).max)


@pytest.mark.parametrize(
    "value, numpy_type, dtype",
    [
        (FLOAT32_MAX, np.float32, "float32"),
        (float(np.nextafter(FLOAT32_MAX, math.inf)), np.float32, "float32"),  # rounds down to the largest float32
        ((2 - 2.0**-24) * 2.0**127, np.float32, "float32"),  # the midpoint to 2^128: rounds to even, inf
        (1e39, np.float32, "float32"),
        (1e39, np.float32, "float64"),  # the bias is computed in float32 whatever the training dtype
        (FLOAT16_MAX, np.float16, "float16"),
        (65519.0, np.float16, "float16"),  # below the midpoint 65520: rounds to 65504
        (65520.0, np.float16, "float16"),  # the midpoint: inf
        (1e5, np.float16, "float16"),
        (1e5, np.float32, "bfloat16"),  # bfloat16 holds it
    ],
)
def test_a_slope_is_refused_exactly_where_numpy_rounds_it_to_inf(value, numpy_type, dtype):
    with np.errstate(over="ignore"):
        reference = bool(np.isfinite(numpy_type(value)))  # numpy's own rounding of a float64 to the narrow type
    assert builds(f"alibi([{value!r}, 0.5])", dtype) == reference
    assert (not_finite_in([value], dtype) is None) == reference


@pytest.mark.parametrize(
    "spec, dtype, message",
    [
        (
            "alibi([1e39, 0.5])",
            "float32",
            "ALiBi slopes must be positive and finite in float32 (from 1.401e-45 up to 3.403e+38), got [1e+39, 0.5]",
        ),
        (
            "alibi([1e5, 0.5])",
            "float16",
            "ALiBi slopes must be positive and finite in float16 (from 5.96e-08 up to 6.55e+04), got [100000.0, 0.5]",
        ),
        ("alibi([1e-50, 0.5])", "float32", "ALiBi slopes must be positive and finite in float32"),  # 0 in float32
        ("alibi(blind_distances=[1e-45, 8])", "float32", "(from blind_distances [1e-45, 8])"),
        ("alibi([1e39, 0.5], learnable=True)", "float32", "ALiBi slopes must be positive and finite in float32"),
        ("alibi+clamp(floor=-1e39)", "float32", "clamp floor must be finite in float32 (magnitude up to 3.403e+38)"),
        (
            "alibi+clamp(floor=-7e4)",
            "float16",
            "clamp floor must be finite in float16 (magnitude up to 6.55e+04), got -70000.0",
        ),
        ("alibi+soft_cap(1e39)", "float32", "soft_cap cap must be finite in float32"),
        ("rope(theta=1e39)", "float32", "rope theta must be finite in float32"),
        ("kerple_log(r1=[1e39, 1])", "float32", "kerple_log r1 must be finite in float32"),
        (
            "kerple_log(r1=[1e5, 1])",
            "float16",
            "position component kerple_log(r1=[100000.0, 1]): its raw_r1 is not "
            "finite in float16 (magnitude up to 6.55e+04)",
        ),
        (
            "t5_buckets(init_std=1e38)",
            "float32",
            "position component t5_buckets(init_std=1e+38): its table is not finite in float32",
        ),
        ("fire(c=1e39)", "float32", "fire c must be finite in float32"),
        ("sliding_window(1e39)", "float32", "sliding_window size must be finite in float32"),
    ],
)
def test_a_number_beyond_its_dtype_is_refused_naming_it(spec, dtype, message):
    with pytest.raises(ValueError) as refused:
        build_position(spec, 2, 64, dtype)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_what_fits_still_builds_and_keeps_its_values():
    stack = build_position("alibi([6e4, 0.5])+clamp(floor=-6e4)", 2, 64, "float16")
    alibi, clamp = stack
    assert alibi.slopes.tolist() == [6e4, 0.5] and clamp.floor == -6e4


def test_a_bias_that_overflows_only_far_away_is_a_mask_not_a_nan():
    """A slope finite in float32 whose bias overflows to ``-inf`` far back only masks those keys: accepted, and the
    key itself (distance 0) keeps a finite bias, the nan a slope of ``inf`` would give."""
    stack = build_position("alibi([3e38, 0.5])", 2, 64, "float32")
    bias = stack.dense_bias(4, 4, torch.device("cpu"))
    assert torch.isfinite(bias.diagonal(dim1=-2, dim2=-1)).all() and not bias.isnan().any()
    assert bias[0, 3, 0] == -math.inf and bias[1, 3, 0] == -1.5  # 3e38 * 3 overflows; 0.5 * 3 does not


def test_fit_refuses_a_slope_beyond_float32_in_one_line(tmp_path, cache_dir):
    """The run the issue reported ended in a ``FloatingPointError`` traceback after 5 skipped steps."""
    shape = {"--model.decoder.hidden_size": "32", "--model.decoder.num_layers": "1", "--model.decoder.num_heads": "2",
             "--model.decoder.num_kv_heads": "2", "--model.decoder.mlp_size": "64"}  # fmt: skip
    args = tiny_run_args(tmp_path, cache_dir, **shape, **{"--model.decoder.position": "alibi([1e39, 0.5])"})
    said = refusal(["fit", *args])
    assert said.startswith("blindheads fit: error: ALiBi slopes must be positive and finite in float32")
    assert "got [1e+39, 0.5]" in said and "\n" not in said
