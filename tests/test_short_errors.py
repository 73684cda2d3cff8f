"""A mistake on any subcommand's command line costs a couple of lines: the error, then where the options are listed."""

from __future__ import annotations

import pytest
from support.runs import REPO

from blindheads.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_option_is_one_error_and_a_pointer_to_help(command, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exit:
        main([command, "--no-such-option", "1"])
    message = str(exit.value.code) if isinstance(exit.value.code, str) else capsys.readouterr().err
    lines = message.strip().splitlines()
    assert 2 <= len(lines) <= 3, message
    if command == "lm_eval":  # lm-evaluation-harness's own parser: its usage line, then the error
        assert "unrecognized arguments: --no-such-option 1" in lines[-1]
        return
    assert lines[0].startswith(f"blindheads {command}: error: ") and lines[-1] == f"see: blindheads {command} --help"


@pytest.mark.parametrize(
    "config, expected",
    [
        ("model:\n  decoder:\n    hidden_size: [\n", "Problems parsing config"),
        ("just a string\n", "Unexpected config: just a string"),
        ("model:\n  decoder:\n    hiden_size: 64\n", "does not accept option 'model.decoder.hiden_size'"),
        ("trainer:\n  max_steps: many\n", 'Parser key "trainer.max_steps"'),
    ],
    ids=["broken yaml", "not a mapping", "unknown key", "wrong type"],
)
def test_a_bad_config_file_is_a_short_error(config, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    (tmp_path / "bad.yaml").write_text(config)
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", "configs/smoke.yaml", "--config", str(tmp_path / "bad.yaml")])
    message = str(exit.value.code)
    assert expected in message and message.endswith("see: blindheads fit --help")
    assert len(message.splitlines()) <= 5


def test_a_run_name_no_folder_can_hold_is_refused(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", "configs/smoke.yaml", "--trainer.logger.init_args.name", "x" * 259])
    assert str(exit.value.code) == (
        "blindheads fit: error: --trainer.logger.init_args.name is 259 bytes long: a folder name holds at most 255"
    )
