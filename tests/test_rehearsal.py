"""Every GPU config rehearsed on the CPU (configs/rehearsal.yaml): the paper recipe composes with each position setup
and trainer file, its own callbacks instantiate, its comments' batch arithmetic holds, and a 2-rank run of it trains,
checkpoints, evaluates, resumes exactly and tests."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from support.runs import REPO, run_cli, scalars

from blindheads.cli import callback_set
from blindheads.cli.lightning import BlindheadsCLI, build_cli
from blindheads.modules.schedules import lr_multiplier

PAPER = REPO / "configs/experiments/paper.yaml"
REHEARSAL = REPO / "configs/rehearsal.yaml"
INTERVALS = ("every_n_steps", "every_n_train_steps")
COSTS = ("samples",)  # prompts per retrieval cell: fewer on the CPU, every cell kept
GPU_FILES = [*sorted((REPO / "configs/position").glob("*.yaml")), *(REPO / "configs/trainer").glob("[!c]*.yaml")]


def test_the_rehearsal_keeps_the_papers_callbacks_but_for_their_intervals_and_sample_counts(monkeypatch):
    """The callbacks as parsed from paper.yaml alone and with the rehearsal over it: the same classes and arguments,
    but for the intervals (each of which fires within the rehearsal's steps, and at its last) and the prompt counts."""

    def used(*configs):
        cli = build_cli([*(f"--config={config}" for config in configs), "--trainer.logger=false"], run=False)
        return callback_set.used(cli.config.callbacks)

    def unscaled(callbacks):
        return [(kind, {k: v for k, v in args.items() if k not in INTERVALS + COSTS}) for kind, args in callbacks]

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(BlindheadsCLI, "instantiate_classes", lambda self: None)  # the parsed options are compared
    paper, rehearsal = used(PAPER), used(PAPER, REHEARSAL)
    assert unscaled(rehearsal) == unscaled(paper) and rehearsal != paper
    steps = yaml.safe_load(REHEARSAL.read_text())["trainer"]["max_steps"]
    intervals = [v for _, args in rehearsal for k, v in args.items() if k in INTERVALS and v is not None]
    assert intervals and all(v <= steps and steps % v == 0 for v in intervals), "each fires, and at the last step"


@pytest.mark.parametrize("extra", GPU_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_gpu_config_composes_with_the_rehearsal(extra, cache_dir, monkeypatch):
    monkeypatch.chdir(REPO)
    args = ["--config", str(PAPER), "--config", str(extra), "--config", str(REHEARSAL)]
    cli = build_cli([*args, "--data.cache_dir", str(cache_dir), "--trainer.logger", "false"], run=False)
    assert cli.trainer.num_devices == 2 and type(cli.trainer.strategy).__name__ == "DDPStrategy"
    own = yaml.safe_load(extra.read_text()).get("model", {}).get("decoder", {})
    assert cli.model.config.num_heads == 9 and cli.model.config.dtype == own.get("dtype", "bfloat16")
    if extra.parent.name == "position":
        assert cli.model.config.position == yaml.safe_load(extra.read_text())["model"]["decoder"]["position"]


def test_the_paper_recipe_with_its_own_callbacks_instantiates_on_the_cpu(cache_dir, monkeypatch):
    """Only the device and the data swapped: a misspelled argument anywhere in paper.yaml or its callbacks fails."""
    monkeypatch.chdir(REPO)
    cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--data.source", "builtin",
           "--data.tokenizer", "builtin", "--data.cache_dir", str(cache_dir), "--trainer.logger", "false"]  # fmt: skip
    cli = build_cli(["--config", str(PAPER), *cpu], run=False)
    names = {type(c).__name__ for c in cli.trainer.callbacks}
    assert {"UnderflowMonitor", "PasskeyEval", "NeedleEval", "LengthExtrapolation", "TokenThroughput"} <= names


def test_the_papers_batch_arithmetic_matches_its_comments():
    text = PAPER.read_text()
    config = yaml.safe_load(text)
    gpus, per_gpu, length, tokens = map(_int, re.search(r"(\d+) GPUs x (\d+) x (\d+) = ([\d,]+)", text).groups())
    steps, per_step, total = re.search(r"([\d,]+) x ([\d,]+) = ([\d.]+)B tokens", text).groups()
    trainer, data = config["trainer"], config["data"]
    accumulate = trainer.get("accumulate_grad_batches", 1)
    assert (gpus, per_gpu, length) == (trainer["devices"], data["batch_size"], data["seq_len"])
    assert tokens == _int(per_step) == gpus * per_gpu * length * accumulate
    assert _int(steps) == trainer["max_steps"] and round(trainer["max_steps"] * tokens / 1e9, 1) == float(total)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.slow
def test_the_paper_recipe_rehearsed_on_two_ranks(cache_dir, tmp_path):
    """paper.yaml + model/wide.yaml (the setup its comment names) + rehearsal.yaml: 12 steps on 2 gloo ranks, then a
    resume from the step-6 checkpoint that repeats steps 7-12 exactly (without the evaluations, which the fit and the
    test run), then test."""
    common = ["--config", str(PAPER), "--config", str(REPO / "configs/position/wide.yaml"), "--config", str(REHEARSAL),
              "--data.cache_dir", str(cache_dir), "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    fit = run_cli(["fit", *common, "--trainer.logger.init_args.version", "run"], timeout=900)
    assert fit.returncode == 0, fit.stderr[-3000:]
    run = tmp_path / "wide/run"  # model/wide.yaml names the run
    for prefix in ("underflow/", "passkey/", "needle/", "extrapolation/", "lr-AdamW", "train/time", "val/loss"):
        assert any(tag.startswith(prefix) for tag in _tags(run)), f"no {prefix} tags: its callback did not log"
    assert {p.name for p in (run / "checkpoints").iterdir()} >= {"epoch=0-step=6.ckpt", "last.ckpt"}

    lr = scalars(run, "lr-AdamW/pg1")  # the matrices' group (pg2: norms and biases, no weight decay)
    config = yaml.safe_load(PAPER.read_text())["model"]
    expected = {step: 0.003 * lr_multiplier(step, 12, "wsd", 4, config["decay_fraction"]) for step in range(12)}
    assert lr == pytest.approx(expected), "warmup 4 steps, stable, 1-sqrt cooldown over the last 20% (10, 11)"
    assert scalars(run, "train/tokens")[11] == 12 * 2 * 2 * 512, "steps x ranks x windows x tokens"

    # the resume's steps, not its evaluations, are under test: it keeps only the checkpoint callback
    resumed = run_cli(["fit", *common, "--trainer.logger.init_args.version", "resumed", "--callbacks.use=[checkpoint]",
                       "--ckpt_path", str(run / "checkpoints/epoch=0-step=6.ckpt")], timeout=900)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    before, after = scalars(run, "train/loss"), scalars(tmp_path / "wide/resumed", "train/loss")
    assert after and {s: before[s] for s in after} == after

    test = run_cli(["test", *common, "--trainer.logger.init_args.version", "run", "--ckpt_path", "last"], timeout=900)
    assert test.returncode == 0, test.stderr[-3000:]
    metrics = json.loads((run / "results.json").read_text())["metrics"]
    assert "test/passkey/auc_out_of_domain" in metrics and "test/needle/auc_in_domain" in metrics


def _tags(run) -> set[str]:
    from blindheads.analysis.runs import scalars as run_scalars

    return set(run_scalars(run)["tag"])


def test_the_papers_data_is_configs_data_hub_yaml_which_the_data_module_defaults_to():
    """paper.yaml names no data source: it trains on the data module's defaults, which must stay hub.yaml's."""
    import inspect

    from blindheads.datamodules.text import TextData

    hub = yaml.safe_load((REPO / "configs/data/hub.yaml").read_text())["data"]
    defaults = inspect.signature(TextData).parameters
    assert {key: defaults[key].default for key in hub} == hub
    assert not set(hub) & set(yaml.safe_load(PAPER.read_text())["data"]), "restated, not composed"
