"""benchmarks/litgpt_throughput.py at a tiny shape, in-process: its models build with the parameter counts it
prints, and a timed training step of each gives a finite loss. Ours always; litgpt's only where it is installed
(``make benchmark-litgpt`` puts it in .bench/litgpt); nothing is downloaded."""

from __future__ import annotations

import math

import pytest
from support.runs import benchmark_module

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--length", "32", "--vocab", "128", "--batch", "2",
        "--steps", "1", "--warmup", "1", "--repeats", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("litgpt_throughput") as module:
        yield module


def tiny_shape(bench, tie=False):
    args = bench.parse(TINY)
    return bench.Shape(args.layers, args.hidden, args.heads, None, None, args.length, args.vocab, tie)


def printed_parameters(out: str, names) -> dict[str, int]:
    """The parameters column of the benchmark's table, per model."""
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    return {name: int(rows[name].split()[-2].replace(",", "")) for name in names}


def check_one_step(bench, models, shape):
    inputs, targets = bench.batch(shape, 2)
    for name, model in models.items():
        seconds, losses = bench.Trainer(model).timed(inputs, targets, 1)
        assert seconds > 0 and len(losses) == 1 and math.isfinite(losses[0]), name
        assert abs(losses[0] - math.log(shape.vocab)) < 1.0, name  # near-uniform logits at the start


@pytest.mark.parametrize("tie", [False, True])
def test_ours_builds_with_the_printed_counts_and_steps(bench, capsys, tie):
    shape = tiny_shape(bench, tie)
    models = bench.build_models(shape, litgpt=None)
    assert list(models) == [f"ours ({p})" for p in bench.POSITIONS]
    counts = {name: bench.count_parameters(model) for name, model in models.items()}
    assert set(counts.values()) == {shape.parameters()}
    assert bench.main([*TINY, "--without-litgpt", *(["--tie-embeddings"] if tie else [])]) == 0
    out = capsys.readouterr().out
    assert f"{shape.parameters():,} parameters in each" in out
    assert printed_parameters(out, models) == counts
    check_one_step(bench, models, shape)


def test_litgpt_builds_the_same_shape_and_steps(bench, capsys):
    with bench.litgpt_on_path():
        model = pytest.importorskip("litgpt.model")
    for tie in (False, True):
        shape = tiny_shape(bench, tie)
        gpt = bench.litgpt_gpt(shape, model)
        assert bench.count_parameters(gpt) == shape.parameters()
        assert (gpt.lm_head.weight is gpt.transformer.wte.weight) == tie
        check_one_step(bench, {bench.LITGPT: gpt}, shape)
    assert bench.main(TINY) == 0
    out = capsys.readouterr().out
    assert printed_parameters(out, [bench.LITGPT, "ours (rope)"]) == dict.fromkeys(
        [bench.LITGPT, "ours (rope)"], tiny_shape(bench).parameters()
    )
    assert "ours (rope) / litgpt (rope) tokens/s: " in out
