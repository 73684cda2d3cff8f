"""The callback set (``callbacks:``): each argument an option by name, which a later config file or the command
line changes alone; ``callbacks.use`` for the ones that run; a run's config record that rebuilds each once."""

from __future__ import annotations

import pytest
from support.runs import REPO, refusal, tiny_run_args

from blindheads.cli.lightning import BlindheadsCLI, build_cli

LAPTOP, DENSE_RECALL = (str(REPO / f"configs/experiments/{name}.yaml") for name in ("laptop", "dense_recall"))


def parsed(args: list[str], monkeypatch) -> BlindheadsCLI:
    monkeypatch.setattr(BlindheadsCLI, "instantiate_classes", lambda self: None)
    return build_cli([*args, "--trainer.logger=false"], run=False)


def test_a_later_file_and_the_command_line_change_one_argument_by_name(monkeypatch):
    args = ["--config", LAPTOP, "--config", DENSE_RECALL, "--callbacks.recall.samples", "8"]
    callbacks = parsed(args, monkeypatch).config.callbacks
    assert (callbacks.recall.gaps, callbacks.recall.samples, callbacks.recall.every_n_steps) == ([4, 16], 8, None)
    assert (callbacks.passkey.length_factors, callbacks.passkey.batch_size) == ([2.0, 4.0], 8), "laptop's batch kept"
    assert callbacks.checkpoint.save_last and callbacks.use[-1] == "recall", "the base's and laptop.yaml's, kept"


def test_an_unknown_callback_is_refused_naming_the_valid_ones(monkeypatch):
    with pytest.raises(
        ValueError, match=r"--callbacks.use: unknown callback 'recal'; valid: progress, .*, recall, warm_start$"
    ):
        parsed(["--config", LAPTOP, "--callbacks.use+=recal"], monkeypatch)


@pytest.mark.parametrize("twice", ["checkpoint", "recall"])
def test_a_callback_used_twice_is_refused(cache_dir, tmp_path, twice):
    """``[checkpoint, checkpoint]`` ended in Lightning's traceback, ``[recall, recall]`` ran the evaluation twice."""
    message = refusal(["fit", *tiny_run_args(tmp_path, cache_dir), f"--callbacks.use=[{twice}, {twice}]"])
    assert message == (
        f"blindheads fit: error: --callbacks.use names {twice} more than once; each callback runs once: give it once"
    )


def test_a_runs_config_record_rebuilds_its_callbacks_once(cache_dir, tmp_path):
    """What ``config.yaml`` holds (the parsed options, dumped as the run saves them), given back with ``--config``:
    the set's callbacks and a listed one, each once, in the same order."""
    args = [
        *tiny_run_args(tmp_path, cache_dir, evaluations=True),
        "--trainer.callbacks+=lightning.pytorch.callbacks.DeviceStatsMonitor",
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        first = build_cli(args, run=False)
        record = tmp_path / "config.yaml"
        record.write_text(first.parser.dump(first.config, skip_none=False))
        again = build_cli(["--config", str(record)], run=False)
    names = [type(callback).__name__ for callback in first.trainer.callbacks]
    assert [type(callback).__name__ for callback in again.trainer.callbacks] == names
    assert names.count("ModelCheckpoint") == names.count("DeviceStatsMonitor") == 1
    assert names.index("UnderflowMonitor") < names.index("DeviceStatsMonitor"), "the set first, then trainer.callbacks"
