"""Experiment run directories: keyed by their options, refused when asked with others, records written whole."""

from __future__ import annotations

import json

import pytest

from blindheads.experiments import grid
from blindheads.experiments.runner import RunChanged, claim, identity, read_json, write_json


def test_a_run_directory_made_with_other_options_is_refused_naming_the_difference(tmp_path):
    config = tmp_path / "exp.yaml"
    callbacks = tmp_path / "callbacks.yaml"
    config.write_text("trainer:\n  max_steps: 3\n  callbacks: callbacks.yaml\n")
    callbacks.write_text("- class_path: x\n")
    run = tmp_path / "runs/alibi/seed0"
    claim(run, identity(["--seed_everything", "0"], [str(config)]))
    claim(run, identity(["--seed_everything", "0"], [str(config)]))  # the same options: accepted
    with pytest.raises(RunChanged, match=r"then --seed_everything 0; now --seed_everything 1\)"):
        claim(run, identity(["--seed_everything", "1"], [str(config)]))
    callbacks.write_text("- class_path: y\n")  # a file the config names changed
    with pytest.raises(RunChanged, match=r"config files changed since: .*callbacks.yaml"):
        claim(run, identity(["--seed_everything", "0"], [str(config)]))


def test_the_grid_refuses_before_running_anything(tmp_path, capsys):
    runs = tmp_path / "runs"
    claim(runs / "nope/seed0", identity(["--old"], []))
    with pytest.raises(SystemExit, match=r"runs/nope/seed0 was made with other options"):
        grid.main(["--setups", "alibi", "nope", "--seeds", "0", "--runs", str(runs), "--out", str(tmp_path / "out")])
    assert not (runs / "alibi/seed0").exists(), "nothing was claimed or started"


def test_records_are_written_whole_and_a_truncated_one_is_named(tmp_path):
    path = tmp_path / "results.json"
    write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    path.write_text('{"a": ')
    with pytest.raises(ValueError, match=rf"{path} is not valid JSON .* remove it and run again"):
        read_json(path)


def test_every_results_file_records_the_command_seeds_machine_and_versions():
    from importlib.metadata import version

    from blindheads.experiments.runner import provenance

    record = provenance("blindheads grid --seeds 1 0", 12.345, [1, 0, 1])
    assert record["command"] == "blindheads grid --seeds 1 0" and record["wall_s"] == 12.3 and record["seeds"] == [0, 1]
    assert record["versions"]["torch"] == version("torch") and "CPUs" in record["machine"] and record["date"]
