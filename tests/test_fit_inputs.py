"""What ``blindheads fit`` accepts: each input an audit tried is refused in one line naming it, or means what a user
expects (the precision as Lightning runs it, ``$VAR`` in a run folder, a shape value given, signals at any phase)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess

import pytest
from support.runs import REPO, refusal, run_cli, tiny_run_args

from blindheads.cli import main
from blindheads.cli.lightning import build_cli

SAVE_DIR = "--trainer.logger.init_args.save_dir"
STEPS = "must be a positive integer, the number of training steps: the learning-rate schedule is sized from it"


def fit_args(tmp_path, cache_dir, *extra: str) -> list[str]:
    return ["fit", *tiny_run_args(tmp_path, cache_dir, **{"--trainer.logger.init_args.version": "run"}), *extra]


def test_the_precision_is_checked_as_lightning_runs_it(cache_dir, tmp_path):
    """On a CPU Lightning runs 16-mixed as bf16 autocast: a float16 model would train in bfloat16."""
    message = refusal(
        fit_args(tmp_path, cache_dir, "--trainer.precision", "16-mixed", "--model.decoder.dtype", "float16")
    )
    assert message == (
        "blindheads fit: error: --trainer.precision 16-mixed runs as bf16-mixed on this accelerator (Lightning "
        "substitutes it), which computes attention in bfloat16, but --model.decoder.dtype is float16: set "
        "--trainer.precision bf16-mixed and --model.decoder.dtype bfloat16, or run 16-mixed where it is supported (a GPU)"
    )
    assert not (tmp_path / "alibi").exists()


def test_variables_in_the_run_folder_are_expanded_once_for_logs_and_checkpoints(cache_dir, tmp_path, monkeypatch):
    """TensorBoard expands ``$VAR`` in its own path; checkpoints (``save_dir/name/version/checkpoints``) and
    ``--ckpt_path last`` read the logger's ``save_dir``: both are the expanded folder. A typed shape value wins over
    the ``tiny`` preset, with its own KV heads."""
    monkeypatch.setenv("BLINDHEADS_TEST_ROOT", str(tmp_path))
    args = fit_args(tmp_path, cache_dir, SAVE_DIR, "${BLINDHEADS_TEST_ROOT}/runs", "--model.decoder.num_heads", "8")
    cli = build_cli(args[1:], run=False)
    assert cli.config.trainer.logger.init_args.save_dir == cli.trainer.logger.save_dir == str(tmp_path / "runs")
    assert cli.trainer.logger.log_dir == str(tmp_path / "runs/alibi/run")
    assert (cli.model.config.num_heads, cli.model.config.num_kv_heads, cli.model.config.hidden_size) == (8, 8, 64)
    assert cli.config.model.decoder.num_heads == 8  # config.yaml records it
    monkeypatch.delenv("BLINDHEADS_TEST_ROOT")
    assert refusal(fit_args(tmp_path, cache_dir, SAVE_DIR, "${BLINDHEADS_TEST_ROOT}/runs")) == (
        f"blindheads fit: error: {SAVE_DIR} ${{BLINDHEADS_TEST_ROOT}}/runs: environment variable BLINDHEADS_TEST_ROOT "
        "is not set; set it, or give the path"
    )


@contextlib.contextmanager
def tmpfs(path, options: str):
    """A small file system mounted at ``path`` (read-only or full on demand: what a permission bit cannot make for
    root, whom permissions do not stop)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_run_folder_that_cannot_be_written_is_one_line(cache_dir, tmp_path):
    (tmp_path / "a-file").write_text("")
    message = refusal(fit_args(tmp_path, cache_dir, SAVE_DIR, str(tmp_path / "a-file")))
    assert (
        message
        == f"blindheads fit: error: {SAVE_DIR} {tmp_path / 'a-file'} cannot be written: {tmp_path / 'a-file'} is a file, not a folder"
    )
    with tmpfs(tmp_path / "read-only", "ro,size=64k") as folder:
        assert refusal(fit_args(tmp_path, cache_dir, SAVE_DIR, str(folder / "runs"))) == (
            f"blindheads fit: error: {SAVE_DIR} {folder / 'runs'} cannot be written: {folder} is on a read-only "
            "file system"
        )
    with tmpfs(tmp_path / "full", "size=64k") as folder:
        with contextlib.suppress(OSError), open(folder / "filler", "wb") as filler:
            filler.write(bytes(1 << 20))
        message = refusal(fit_args(tmp_path, cache_dir, SAVE_DIR, str(folder / "runs")))
        assert re.fullmatch(
            rf"blindheads fit: error: {SAVE_DIR} {re.escape(str(folder / 'runs'))} cannot be written: no space left "
            rf"on device \(\d+ B free on {re.escape(str(folder))}\)",
            message,
        ), message


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--model.lr", ".nan", "--model.lr nan is not a finite number > 0"),
        ("--model.lr", "1e400", "--model.lr inf is not a finite number > 0 (a number beyond 1.8e308 reads as inf)"),
        ("--model.weight_decay", "-0.1", "--model.weight_decay -0.1 is not a finite number >= 0"),
        ("--model.decoder.num_heads", "0", "num_heads must be >= 1, got 0"),
        ("--trainer.max_steps", "0", f"--trainer.max_steps 0 {STEPS}"),  # was "set trainer.max_steps", though set
        ("--trainer.max_steps", "-1", f"--trainer.max_steps -1 (Lightning's default: not set, without end) {STEPS}"),
    ],
)
def test_a_value_that_cannot_train_is_refused_naming_it(cache_dir, tmp_path, option, value, message):
    assert refusal(fit_args(tmp_path, cache_dir, option, value)) == f"blindheads fit: error: {message}"


def test_a_partial_model_config_gets_kv_heads_from_its_own_heads(tmp_path, capsys):
    """Only ``num_heads: 8``: the default preset's 9 KV heads do not leak in; a value it cannot fit names its source."""
    (tmp_path / "heads.yaml").write_text("model:\n  decoder:\n    num_heads: 8\n")
    main(["blindness", "--config", str(tmp_path / "heads.yaml")])
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:-1]] == [str(h) for h in range(8)]
    (tmp_path / "hidden.yaml").write_text("model:\n  decoder:\n    hidden_size: 128\n")
    with pytest.raises(SystemExit) as exit:
        main(["blindness", "--config", str(tmp_path / "hidden.yaml")])
    assert exit.value.code == (
        "blindheads blindness: error: hidden_size 128 is not divisible by num_heads 9 (the smollm-148m preset's)"
    )


@pytest.mark.parametrize(
    "where, option",
    [("callbacks", "trainer:\n  callbacks:\n    - class_path: this.Nothing\n"),
     ("logger", "trainer:\n  logger:\n    class_path: this.Nothing\n")],
    ids=["callback", "logger"],
)  # fmt: skip
def test_a_class_path_that_names_nothing_is_one_line(tmp_path, monkeypatch, where, option):
    monkeypatch.chdir(REPO)
    (tmp_path / "bad.yaml").write_text(option)
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", "configs/smoke.yaml", "--config", str(tmp_path / "bad.yaml")])
    assert exit.value.code == (
        f"blindheads fit: error: trainer.{where}: class_path this.Nothing: module 'this' has no attribute 'Nothing'\n"
        "see: blindheads fit --help"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "callback, signum, line",
    [
        (["support.callbacks.SignalInSanityCheck"], signal.SIGINT,
         "blindheads: SIGINT at step 0, before this run's first step: nothing new to save"),
        (["support.callbacks.SignalAtStep", "--trainer.callbacks.step=2", "--data.num_workers", "1"], signal.SIGHUP,
         "blindheads: SIGHUP at step 2: saved {last}; resume with --ckpt_path last"),  # the worker ignores it
    ],
    ids=["SIGINT in the sanity check", "SIGHUP (terminal closed)"],
)  # fmt: skip
def test_a_signal_at_any_phase_exits_in_one_line(cache_dir, tmp_path, callback, signum, line):
    """A subprocess: the callback signals the whole process group, as a terminal does."""
    name, *options = callback
    stopped = run_cli(fit_args(tmp_path, cache_dir, f"--trainer.callbacks+={name}",
                               f"--trainer.callbacks.signum={int(signum)}", *options))  # fmt: skip
    last = tmp_path / "alibi/run/checkpoints/last.ckpt"
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    assert stopped.stderr.rstrip().splitlines()[-1] == line.format(last=last)
    assert "Traceback" not in stopped.stderr and "DataLoader worker" not in stopped.stderr
    assert last.exists() == (signum == signal.SIGHUP)
