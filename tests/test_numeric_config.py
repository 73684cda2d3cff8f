"""Every numeric field of ``DecoderConfig`` is a number in its range, checked in one place that runs when a config
is constructed (YAML, a CLI flag, Python) and when one is unpickled from a checkpoint, which skips ``__init__``:
``norm_eps=nan`` exported a model whose logits were all nan, ``init_std=nan`` ended ``export`` in a traceback."""

import dataclasses
import math
import pickle

import numpy as np
import pytest
import torch
from support.runs import refusal, tiny_run_args

from blindheads.checkpoints.reading import read_checkpoint
from blindheads.modules.config import SIZES, DecoderConfig
from blindheads.modules.lm import DecoderLM

TINY = {**SIZES["tiny"].__dict__, "attention": "sdpa", "dtype": "float32"}
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # numpy's smallest normal float32, the reference for the bound


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("norm_eps", math.nan, "norm_eps must be in [1.175e-38, 1], got nan: RMSNorm adds it to a mean square"),
        ("norm_eps", -1.0, "norm_eps must be in [1.175e-38, 1], got -1.0"),
        ("norm_eps", 0.0, "norm_eps must be in [1.175e-38, 1], got 0.0"),
        ("norm_eps", 2.0, "norm_eps must be in [1.175e-38, 1], got 2.0"),
        ("norm_eps", float(np.nextafter(np.float32(FLOAT32_TINY), np.float32(0))), "got 1.1754942106924411e-38"),
        ("norm_eps", "1e-5", "norm_eps must be in [1.175e-38, 1], got '1e-5'"),
        ("init_std", math.nan, "init_std must be in (0, 1], got nan"),
        ("init_std", math.inf, "init_std must be in (0, 1], got inf"),
        ("context_length", 0, "context_length must be >= 1, got 0"),
        ("hidden_size", 64.0, "hidden_size must be a whole number >= 1, got 64.0"),
        ("num_layers", True, "num_layers must be a whole number >= 1, got True"),
    ],
)
def test_a_numeric_field_out_of_range_is_refused_naming_it(field, value, message):
    with pytest.raises(ValueError) as refused:
        DecoderConfig(**{**TINY, field: value})
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_range_ends_are_where_float32_says():
    """``norm_eps`` down to float32's smallest normal number (numpy's ``finfo``) and up to 1 is accepted."""
    for value in (FLOAT32_TINY, 1e-5, 1.0):
        assert DecoderConfig(**{**TINY, "norm_eps": value}).norm_eps == value


def bad_copy(config: DecoderConfig, **values) -> DecoderConfig:
    """``config`` with ``values`` set as an unpickled object could hold them (no ``__init__``, no check)."""
    bad = dataclasses.replace(config)
    for name, value in values.items():
        object.__setattr__(bad, name, value)
    return bad


def test_unpickling_checks_the_fields_as_construction_does():
    config = DecoderConfig(**TINY)
    assert pickle.loads(pickle.dumps(config)) == config, "a valid config comes back as it was"
    with pytest.raises(ValueError, match=r"norm_eps must be in \[1.175e-38, 1\], got nan"):
        pickle.loads(pickle.dumps(bad_copy(config, norm_eps=math.nan)))


def model_checkpoint(path, decoder) -> str:
    """The parts of a Lightning checkpoint that ``export`` reads, with ``decoder`` as its hyperparameter."""
    torch.manual_seed(0)
    model = DecoderLM(DecoderConfig(**TINY))
    torch.save({"hyper_parameters": {**model.hparams, "decoder": decoder}, "state_dict": model.state_dict()}, path)
    return str(path)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"init_std": math.nan}, "init_std must be in (0, 1], got nan"),  # was a 30-line traceback
        ({"norm_eps": math.nan}, "norm_eps must be in [1.175e-38, 1], got nan"),  # was exit 0, nan logits
        ({"norm_eps": -1.0}, "norm_eps must be in [1.175e-38, 1], got -1.0"),
    ],
)
@pytest.mark.parametrize("held", ["pickled", "as fields"])  # a model built in Python, or by the CLI
def test_a_checkpoint_whose_config_is_out_of_range_is_refused_in_one_line(tmp_path, values, message, held):
    config = DecoderConfig(**TINY)
    decoder = bad_copy(config, **values) if held == "pickled" else {**config.__dict__, **values}
    ckpt = model_checkpoint(tmp_path / "bad.ckpt", decoder)
    if held == "pickled":
        with pytest.raises(ValueError) as refused:
            read_checkpoint(ckpt)  # every load in the project, Lightning's own included, goes through it
        assert str(refused.value).startswith(f"{ckpt}: its decoder config: {message}")
    said = refusal(["export", "--ckpt_path", ckpt, "--out", str(tmp_path / "hf")])
    assert said.startswith(f"blindheads export: error: {ckpt}: its decoder config: {message}"), said
    assert "\n" not in said and not (tmp_path / "hf").exists(), "nothing exported"


def test_fit_refuses_a_norm_eps_out_of_range_in_one_line(tmp_path, cache_dir):
    args = tiny_run_args(tmp_path, cache_dir, **{"--model.decoder.norm_eps": "-1"})
    said = refusal(["fit", *args])
    assert said.startswith("blindheads fit: error: norm_eps must be in [1.175e-38, 1], got -1.0"), said
