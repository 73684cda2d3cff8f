"""Training through the CLI: smoke fit and test, every config, exact resume after SIGKILL, failure handling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from support.runs import REPO, TESTS, copy_run, in_process, refusal, run_cli, scalars, tiny_run_args

from blindheads.checkpoints.reading import read_checkpoint
from blindheads.cli.lightning import build_cli
from blindheads.modules.schedules import lr_multiplier

# Every config a user passes with --config; configs/callbacks/ holds the callbacks' defaults, configs/strategies/ parts
# the configs name.
CONFIGS = sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "configs").rglob("*.yaml")
    if p.parent.name not in ("callbacks", "strategies", "launcher", "lm_eval")  # those are no fit configs
)


def test_lr_schedules():
    assert lr_multiplier(0, 100, "cosine", 10) == pytest.approx(0.1)
    assert lr_multiplier(9, 100, "cosine", 10) == pytest.approx(1.0)
    assert lr_multiplier(55, 100, "cosine", 10, min_ratio=0.1) == pytest.approx(0.55)
    assert lr_multiplier(100, 100, "cosine", 10, min_ratio=0.1) == pytest.approx(0.1)
    assert lr_multiplier(79, 100, "wsd", 10, decay_fraction=0.2) == 1.0
    assert lr_multiplier(85, 100, "wsd", 10, decay_fraction=0.2) == pytest.approx(1 - 0.25**0.5)
    assert lr_multiplier(100, 100, "wsd", 10, decay_fraction=0.2) == 0.0
    with pytest.raises(ValueError, match="valid: cosine, wsd"):
        lr_multiplier(50, 100, "linear", 10)


def own_precision(config: str) -> list[str]:
    """A position setup, or an overlay, that computes in its own dtype (float64, bfloat16) keeps its precision over
    cpu.yaml's."""
    own = yaml.safe_load((REPO / config).read_text()) or {}
    own_dtype = "position" in config or "dtype" in (own.get("model") or {}).get("decoder", {})
    own_dtype = own_dtype and config != "configs/experiments/paper.yaml"  # cpu.yaml runs the paper in float32
    precision = own.get("trainer", {}).get("precision") if own_dtype else None
    return [f"--trainer.precision={precision}"] if precision else []


def eager_only(config: str) -> bool:
    """A setup whose gradient floor needs the weights materialised keeps its eager attention."""
    own = yaml.safe_load((REPO / config).read_text()) or {}
    return (own.get("model") or {}).get("decoder", {}).get("gradient_floor") is not None


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_parses_and_builds_its_model(config, cache_dir, tmp_path):
    """Each config composed the way the README does, then shrunk to the tiny size and the offline data."""
    first = [] if config in ("configs/smoke.yaml", "configs/experiments/paper.yaml") else ["configs/smoke.yaml"]
    files, hidden = [*first, config, "configs/size/tiny.yaml", "configs/trainer/cpu.yaml"], 64
    args = [f"--config={file}" for file in files] + [
        "--data.source=builtin", "--data.tokenizer=builtin", f"--data.cache_dir={cache_dir}",
        *([] if eager_only(config) else ["--model.decoder.attention=sdpa"]), "--model.compile=false",
        "--trainer.strategy=auto",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        *(["--model.decoder.dtype=float32"] if config == "configs/experiments/paper.yaml" else []),  # cpu.yaml
        *own_precision(config),
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        cli = build_cli(args, run=False)
    model = cli.model
    assert model.config.hidden_size == hidden and model.config.vocab_size == cli.datamodule.vocab_size
    tokens = torch.randint(0, model.config.vocab_size, (1, 16))
    assert model(tokens).shape == (1, 16, model.config.vocab_size)


@pytest.mark.slow
def test_smoke_fit_then_test_through_the_cli(trained_run, cache_dir, tmp_path):
    """The session's shared tiny fit (``trained_run``: 20 steps, every evaluation every 10), then ``test`` on it."""
    assert (trained_run / "checkpoints" / "last.ckpt").exists()
    losses = scalars(trained_run, "train/loss")
    assert sorted(losses) == list(range(20)) and losses[19] < losses[0]
    assert set(scalars(trained_run, "val/loss")) == {9, 19}
    assert scalars(trained_run, "train/tokens")[19] == 20 * 4 * 64

    assert set(scalars(trained_run, "passkey/auc_out_of_domain")) == {10, 20}
    assert set(scalars(trained_run, "underflow/layer1/head3")) == {10, 20}

    run_dir = copy_run(trained_run, tmp_path)
    run = {"--trainer.logger.init_args.version": "run"}
    test = run_cli(["test", *tiny_run_args(tmp_path, cache_dir, evaluations=True, **run), "--ckpt_path", "last"])
    assert test.returncode == 0, test.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 20 and Path(results["ckpt_path"]).name == "last.ckpt"
    metrics = results["metrics"]
    assert metrics["test/loss"] == pytest.approx(scalars(run_dir, "val/loss")[19], rel=1e-4)
    for task in ("passkey", "needle"):
        assert metrics[f"test/{task}/samples_in_domain"] == 0 and metrics[f"test/{task}/samples_out_of_domain"] == 12
        cells = json.loads((run_dir / f"{task}.json").read_text())["cells"]
        assert len(cells) == 4 and {c["in_domain"] for c in cells} == {False}  # 128 and 192 > 64
    assert {
        "test/extrapolation/2x/bucket1",
        "test/underflow/mean_4x",
        "test/grad_zero_given_nonzero_weight/layer0/head0",
        "test/blind_distance_predicted/fused/head0",
    } <= set(metrics)


def kill_and_resume(tmp_path, cache_dir, extra: dict) -> tuple[dict, dict]:
    """Train 20 steps straight; then train, SIGKILL after step 13 (checkpoint at 10), resume from last."""
    straight = run_cli(["fit", *tiny_run_args(tmp_path / "straight", cache_dir, **extra)])
    assert straight.returncode == 0, straight.stderr[-3000:]
    interrupted_args = tiny_run_args(
        tmp_path / "resumed", cache_dir, **extra, **{"--trainer.logger.init_args.version": "run"}
    )
    killed = run_cli(
        ["fit", *interrupted_args, "--trainer.callbacks+=support.callbacks.KillAtStep", "--trainer.callbacks.step=13"]
    )
    assert killed.returncode != 0
    resumed = run_cli(["fit", *interrupted_args, "--ckpt_path", "last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return scalars(tmp_path / "straight", "train/loss"), scalars(tmp_path / "resumed", "train/loss")


@pytest.mark.slow
def test_resume_after_sigkill_equals_the_uninterrupted_run(cache_dir, tmp_path):
    """With 2 data-loader workers (their stream positions are saved); without workers, the interrupt and full-disk
    resumes (tests/test_reliability.py) and tests/test_datamodule.py hold the same promise."""
    straight, resumed = kill_and_resume(tmp_path, cache_dir, {"--data.num_workers": "2"})
    assert sorted(straight) == sorted(resumed) == list(range(20))
    for step in range(20):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-5, abs=1e-6), f"step {step}"


@pytest.mark.slow
def test_ddp_resume_after_sigkill_equals_the_uninterrupted_run(cache_dir, tmp_path):
    ddp = {"--trainer.strategy": "ddp", "--trainer.devices": "2", "--data.num_workers": "1"}
    straight, resumed = kill_and_resume(tmp_path, cache_dir, ddp)
    assert scalars(tmp_path / "straight", "train/tokens")[19] == 20 * 4 * 64 * 2, "both ranks' windows counted"
    assert sorted(straight) == sorted(resumed) == list(range(20))
    for step in range(20):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-5, abs=1e-6), f"step {step}"


@pytest.mark.slow
def test_ranks_stop_within_seconds_when_rank_zero_is_killed(cache_dir, tmp_path):
    """Without the watchdog, rank 1 sits in a collective until gloo's 30-minute timeout."""
    args = tiny_run_args(
        tmp_path, cache_dir, **{"--trainer.strategy": "ddp", "--trainer.devices": "2", "--trainer.max_steps": "100000"}
    )
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [
        sys.executable,
        "-m",
        "blindheads",
        "fit",
        *args,
        "--trainer.callbacks+=support.callbacks.KillRankZeroAtStep",
        "--trainer.callbacks.step=3",
    ]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True) as rank0:
        try:
            _, stderr = rank0.communicate(timeout=300)  # the pipe closes when rank 1, which shares it, exits too
        except subprocess.TimeoutExpired:
            os.killpg(rank0.pid, signal.SIGKILL)
            raise AssertionError("rank 1 was still running 300 s after rank 0 was killed") from None
    assert rank0.returncode == -signal.SIGKILL
    assert "local rank 1 stops: the process that launched it" in stderr, stderr[-3000:]


@pytest.mark.slow
def test_non_finite_loss_stops_training_and_keeps_the_good_checkpoint(cache_dir, tmp_path):
    args = tiny_run_args(tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "run"})
    result = run_cli(
        ["fit", *args, "--trainer.callbacks+=support.callbacks.PoisonAtStep", "--trainer.callbacks.step=7"]
    )
    assert result.returncode != 0
    assert "non-finite training loss or gradients at step 7" in result.stderr
    checkpoint = read_checkpoint(tmp_path / "alibi/run/checkpoints/epoch=0-step=5.ckpt")
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


@pytest.mark.parametrize(
    "override, message",
    [
        (["--model.decoder.position", "alibi+bogus"], "unknown position component 'bogus'"),
        (["--trainer.max_steps", "many"], "max_steps"),
        (["--data.source", "files", "--data.files", "[/no/such/dir/*.parquet]"], "no files match"),
        (["--data.seq_len", "512"], "data.seq_len=512 is longer than the model's context_length=128"),
        (["--model.schedule", "linear"], "valid: cosine, wsd"),
        (["--model.decoder.threshold", "subnorml"], "subnorml"),
        (["--model.decoder.dtype", "float8"], "float8"),
        (["--trainer.max_step", "5"], "--trainer.max_step"),
        (["--model.decoder.num_head", "2"], "--model.decoder.num_head"),
        (["--model.decoder.attention", "flex"], "attention=flex trains only on CUDA"),
    ],
)
def test_config_mistakes_fail_before_training(cache_dir, tmp_path, override, message):
    assert message in refusal(["fit", *tiny_run_args(tmp_path, cache_dir), *override])
    assert not list(tmp_path.rglob("*.ckpt")), "no training step ran"


@pytest.mark.slow
def test_two_process_evaluation_equals_single_process(trained_run, cache_dir, tmp_path):
    """Samples are dealt across ranks and reduced with torchmetrics: the numbers are the single process's."""
    run = {"--trainer.logger.init_args.version": "run"}
    checkpoint = str(trained_run / "checkpoints/last.ckpt")
    metrics = {}
    for devices in ("1", "2"):
        args = tiny_run_args(
            tmp_path / f"test{devices}",
            cache_dir,
            evaluations=True,
            **run,
            **{"--trainer.devices": devices, "--trainer.strategy": "ddp" if devices == "2" else "auto"},
        )
        result = run_cli(["test", *args, "--ckpt_path", checkpoint])
        assert result.returncode == 0, result.stderr[-3000:]
        metrics[devices] = json.loads((tmp_path / f"test{devices}/alibi/run/results.json").read_text())["metrics"]
    retrieval = [k for k in metrics["1"] if k.startswith(("test/passkey", "test/needle", "test/extrapolation"))]
    assert len(retrieval) > 20
    for key in retrieval:
        assert metrics["2"][key] == pytest.approx(metrics["1"][key], rel=1e-5), key


@pytest.mark.slow
def test_compiled_blocks_train_like_eager_ones(cache_dir, tmp_path):
    """``model.compile: true`` compiles each block (inductor, on CPU here) and trains to the same losses."""
    losses = {}
    for compiled in ("false", "true"):
        args = tiny_run_args(
            tmp_path / compiled, cache_dir, **{"--model.compile": compiled, "--trainer.max_steps": "4"}
        )
        result = run_cli(["fit", *args])
        assert result.returncode == 0, result.stderr[-3000:]
        losses[compiled] = scalars(tmp_path / compiled, "train/loss")
    assert sorted(losses["true"]) == [0, 1, 2, 3]
    for step in range(4):
        assert losses["true"][step] == pytest.approx(losses["false"][step], rel=1e-3)


def test_configs_compose_left_to_right_and_print():
    code, stdout, stderr = in_process(["fit", "--config", str(REPO / "configs/smoke.yaml"), "--config",
                                       str(REPO / "configs/position/wide_clamp.yaml"), "--print_config"])  # fmt: skip
    assert code == 0, stderr[-2000:]
    assert "position: alibi(wide)+clamp" in stdout and "name: wide_clamp" in stdout
    assert "hidden_size: 128" in stdout, "the earlier file's fields survive the later one"


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "empty or truncated: 0 bytes"),
        (b"\x00garbage" * 100, "not a PyTorch checkpoint file"),
        (None, "no Lightning checkpoint inside"),
    ],
)
def test_a_file_that_is_no_checkpoint_fails_in_one_line(cache_dir, tmp_path, content, reason):
    path = tmp_path / "bad.ckpt"
    if content is None:
        torch.save({"not": "lightning"}, path)
    else:
        path.write_bytes(content)
    message = refusal(["validate", *tiny_run_args(tmp_path, cache_dir), "--ckpt_path", str(path)])
    assert message == f"blindheads validate: error: not a blindheads checkpoint: {path} ({reason})"


@pytest.mark.slow
def test_checkpoint_debris_of_dead_runs_is_removed(cache_dir, tmp_path):
    checkpoints = tmp_path / "alibi" / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    dead, alive = checkpoints / ".last.ckpt.partial-999999999", checkpoints / f".last.ckpt.partial-{os.getpid()}"
    dead.write_bytes(b"half")
    alive.write_bytes(b"still writing")
    args = tiny_run_args(
        tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "run", "--trainer.max_steps": "5"}
    )
    result = run_cli(["fit", *args])
    assert result.returncode == 0, result.stderr[-2000:]
    assert not dead.exists() and alive.exists()


@pytest.mark.slow
def test_resume_from_last_finds_the_run_or_refuses(cache_dir, tmp_path):
    """The README's resume command: no logger version is set, so ``last`` is the newest version's last.ckpt."""
    refused = refusal(["fit", *tiny_run_args(tmp_path, cache_dir), "--ckpt_path", "last"])
    assert f"--ckpt_path last: no intact checkpoint in {tmp_path}/alibi/version_*/checkpoints" in refused
    first = run_cli(["fit", *tiny_run_args(tmp_path, cache_dir, **{"--trainer.max_steps": "10"})])
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run_cli(["fit", *tiny_run_args(tmp_path, cache_dir), "--ckpt_path", "last"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {tmp_path}/alibi/version_0/checkpoints/last.ckpt" in resumed.stderr
    assert sorted(p.name for p in (tmp_path / "alibi").iterdir()) == ["version_0"]  # no new, empty version
    losses = scalars(tmp_path / "alibi" / "version_0", "train/loss")
    assert min(losses) == 0 and max(losses) == 19  # steps 0-9, then 10-19 after the resume


@pytest.mark.slow
def test_a_run_directory_held_by_a_live_run_is_refused_and_a_stale_lock_taken_over(cache_dir, tmp_path):
    run = tmp_path / "alibi" / "run"
    run.mkdir(parents=True)
    lock = run / ".blindheads.lock"
    lock.write_text(str(os.getpid()))  # this test process: alive
    args = tiny_run_args(
        tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "run", "--trainer.max_steps": "5"}
    )
    refused = refusal(["fit", *args])
    assert f"run directory {run} is in use by a live run (pid {os.getpid()})" in refused
    assert not list(run.rglob("*.ckpt")) and not (run / "config.yaml").exists()
    lock.write_text("999999999")  # a run that crashed
    taken = run_cli(["fit", *args])
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert "taking over the lock" in taken.stderr and not lock.exists()  # released at the end
    assert (run / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow
def test_checkpoint_options_are_named_and_evaluations_logged_at_the_checkpoint_step(trained_run, cache_dir, tmp_path):
    """LightningCLI replaces model options with the checkpoint's: a typed one is refused, one from a config file
    is named in the log, and config.yaml records what was used; validate logs at the checkpoint's step."""
    args = tiny_run_args(tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "run"})
    checkpoint = str(trained_run / "checkpoints/last.ckpt")
    for command, typed in (("fit", ["--model.lr", "1e-4"]), ("test", ["--model.decoder.hidden_size", "128"])):
        refused = refusal([command, *args, *typed, "--ckpt_path", checkpoint, "--trainer.max_steps", "21"])
        given = {
            "fit": "model.lr: 0.0001 given, the checkpoint's 0.003 used",
            "test": "model.decoder.hidden_size: 128 given, the checkpoint's 64 used",
        }[command]
        assert given in refused
    validated = run_cli(
        [
            "validate",
            *args,
            "--config",
            str(REPO / "configs/position/wide.yaml"),
            "--ckpt_path",
            checkpoint,
            "--trainer.logger.init_args.version",
            "validated",
        ]
    )
    assert validated.returncode == 0, validated.stderr[-2000:]
    assert "model.decoder.position: 'alibi(wide)' given, the checkpoint's 'alibi' used" in validated.stderr
    assert "position: alibi\n" in (tmp_path / "wide/validated/config.yaml").read_text()
    assert list(scalars(tmp_path / "wide/validated", "val/loss")) == [20]


def test_a_hub_tokenizer_with_the_hub_unreachable_fails_in_seconds(cache_dir, tmp_path):
    """Without asking first, the Hub client retries with backoff ("Retrying in 8s [Retry 5/5]") for about a
    minute per file before failing."""
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    result = run_cli(
        ["fit", *tiny_run_args(tmp_path, cache_dir), "--data.tokenizer", "HuggingFaceTB/SmolLM-135M"], env=env
    )
    assert result.returncode != 0
    assert (
        "cannot load tokenizer 'HuggingFaceTB/SmolLM-135M': tokenizer 'HuggingFaceTB/SmolLM-135M' needs the "
        "Hugging Face Hub, and http://127.0.0.1:9 cannot be reached"
    ) in result.stderr, result.stderr[-2000:]
    assert "'builtin' for the offline tokenizer" in result.stderr
    assert "Retrying" not in result.stderr


def test_a_size_names_a_preset_and_the_config_records_its_shape(cache_dir):
    """configs/size/tiny.yaml names the tiny preset instead of restating it (it clears the earlier file's shape), and
    the parsed config (which config.yaml saves) holds the shape the model has."""
    from blindheads.modules.config import SHAPE, SIZES

    args = [
        "--config",
        str(REPO / "configs/smoke.yaml"),
        "--config",
        str(REPO / "configs/size/tiny.yaml"),
        "--data.cache_dir",
        str(cache_dir),
        "--trainer.logger",
        "false",
    ]
    cli = build_cli(args, run=False)
    for name in SHAPE:
        assert getattr(cli.model.config, name) == cli.config.model.decoder[name] == getattr(SIZES["tiny"], name)


@pytest.mark.parametrize("given", [["--model.decoder.size", "tiny"], ["--config", "size: tiny"], []])
def test_a_size_alone_gives_its_shape_and_none_the_148m(given, cache_dir, tmp_path):
    """Over the CLI's defaults alone, ``size`` (typed or in a file) decides the shape; without one it is the 148M
    preset's."""
    from blindheads.modules.config import SHAPE, SIZES

    if given[:1] == ["--config"]:
        (tmp_path / "size.yaml").write_text("model:\n  decoder: {size: tiny, position: alibi}\n")
        given = ["--config", str(tmp_path / "size.yaml")]
    args = [*given, "--data.source", "builtin", "--data.tokenizer", "builtin", "--data.cache_dir", str(cache_dir),
            "--trainer.precision", "bf16-mixed", "--trainer.logger", "false"]  # fmt: skip
    cli = build_cli(args, run=False)
    preset = SIZES["tiny" if given else "smollm-148m"]
    for name in SHAPE:
        assert getattr(cli.model.config, name) == cli.config.model.decoder[name] == getattr(preset, name)


def test_the_callbacks_base_names_only_what_differs_from_the_signatures_defaults():
    import inspect

    import yaml

    from blindheads.cli.callback_set import KINDS
    from blindheads.packaged import CALLBACK_DEFAULTS

    for name, arguments in yaml.safe_load((REPO / CALLBACK_DEFAULTS).read_text())["callbacks"].items():
        defaults = {}  # a subclass passes some arguments on to its base (**kwargs): the nearest signature's default
        for cls in reversed(KINDS[name].__mro__):
            init = cls.__dict__.get("__init__")
            if init is not None:
                defaults.update({k: p.default for k, p in inspect.signature(init).parameters.items()})
        for key, value in arguments.items():
            default = defaults[key]
            assert value != (list(default) if isinstance(default, tuple) else default), f"{name}.{key} is the default"
