"""Experiment run directories: keyed by their options, refused when asked with others, records written whole; one
live driver per summary folder, every argument checked before anything runs, a summary replaced whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch
from support.runs import REPO, refusal

from blindheads.cli import grid
from blindheads.experiments.driver.folders import DRIVER_LOCK, owned, publish
from blindheads.experiments.driver.identity import RunChanged, claim, identity, summary_identity
from blindheads.experiments.driver.loop import DONE, Run, complete, digest
from blindheads.experiments.driver.records import read_json, write_json
from blindheads.experiments.grid.setups import setup_files
from blindheads.locks import RUN_LOCK
from blindheads.packaged import CALLBACK_DEFAULTS


def test_a_run_directory_made_with_other_options_is_refused_naming_the_difference(tmp_path):
    config = tmp_path / "exp.yaml"
    callbacks = tmp_path / "callbacks.yaml"
    config.write_text("trainer:\n  max_steps: 3\n  callbacks: callbacks.yaml\n")
    callbacks.write_text("- class_path: x\n")
    run = tmp_path / "runs/alibi/seed0"
    claim(run, identity(["--seed_everything", "0"], [str(config)]))
    claim(run, identity(["--seed_everything", "0"], [str(config)]))  # the same options: accepted
    with pytest.raises(RunChanged, match=r"other options \(--seed_everything 0 -> 1\)"):
        claim(run, identity(["--seed_everything", "1"], [str(config)]))
    seeds = tmp_path / "runs/seeds"
    claim(seeds, identity(["--seeds", "0", "1", "--wait"], []))  # once "(then 1; now nothing else)"
    with pytest.raises(RunChanged, match=r"other options \(--seeds 0 1 -> 0; --wait \(given\) -> \(not given\); "
                       r"--hours \(not given\) -> 2\)"):  # fmt: skip
        claim(seeds, identity(["--seeds", "0", "--hours", "2"], []))
    callbacks.write_text("- class_path: y\n")  # a file the config names changed
    with pytest.raises(RunChanged, match=r"config files changed since: .*callbacks.yaml"):
        claim(run, identity(["--seed_everything", "0"], [str(config)]))


def test_the_callback_defaults_every_config_builds_on_are_part_of_a_runs_identity(tmp_path, monkeypatch):
    """``configs/callbacks/base.yaml`` is read by every run though no config names it: editing it changes every
    run's identity, so a grid refuses the runs made before."""
    checkout = tmp_path / "checkout"
    (checkout / "configs/callbacks").mkdir(parents=True)
    (checkout / CALLBACK_DEFAULTS).write_text("callbacks: {}\n")
    monkeypatch.setattr("blindheads.experiments.driver.identity.packaged", lambda path: checkout / path)
    run = tmp_path / "runs/alibi/seed0"
    claim(run, identity([], []))
    (checkout / CALLBACK_DEFAULTS).write_text("callbacks: {checkpoint: {save_top_k: 1}}\n")
    with pytest.raises(RunChanged, match="config files changed since: configs/callbacks/base.yaml"):
        claim(run, identity([], []))


def test_the_grid_refuses_before_running_anything(tmp_path, capsys):
    runs = tmp_path / "runs"
    claim(runs / "nope/seed0", identity(["--old"], []))
    with pytest.raises(RunChanged, match=r"runs/nope/seed0 was made with other options"):
        grid.main(["--setups", "alibi", "nope", "--seeds", "0", "--runs", str(runs), "--out", str(tmp_path / "out")])
    assert not (runs / "alibi/seed0").exists(), "nothing was claimed or started"
    assert not (tmp_path / "out").exists() and not (runs / DRIVER_LOCK).exists(), "the driver let go of both"
    (runs / "nope/seed0/options.json").unlink()
    (runs / "nope/seed0" / RUN_LOCK).write_text(str(os.getppid()))  # a fit an earlier driver left running
    with pytest.raises(RunChanged, match=rf"runs/nope/seed0 is in use by a live run \(pid {os.getppid()}\)"):
        grid.main(["--setups", "alibi", "nope", "--seeds", "0", "--runs", str(runs), "--out", str(tmp_path / "out")])


def test_one_live_driver_owns_an_out_and_a_dead_ones_lock_is_taken_over(tmp_path, capsys):
    """Two grids with one --out would mix their summaries: the second is refused, naming the first's PID."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    command = ["grid", "--setups", "alibi", "--seeds", "0", "--out", str(out), "--runs", str(runs)]
    out.mkdir()
    (out / DRIVER_LOCK).write_text(str(os.getppid()))  # a live process
    assert refusal(command) == (
        f"blindheads grid: error: --out {out} is in use by a live driver (pid {os.getppid()}); wait for it to end or "
        "pass another --out"
    )
    assert not runs.exists(), "refused before anything else"
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / DRIVER_LOCK).write_text(str(dead.pid))
    claim(runs / "alibi/seed0", identity(["--old"], []))  # stops this grid once it owns its folders
    assert "alibi/seed0 was made with other options" in refusal(command)
    assert f"taking over {out} from pid {dead.pid}, which is no longer running" in capsys.readouterr().err
    assert not (out / DRIVER_LOCK).exists() and not (runs / DRIVER_LOCK).exists()


def test_every_argument_is_checked_before_anything_runs(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    runs = tmp_path / "runs"
    refused = {
        ("grid", "--seeds", "0", "0"): "--seeds lists 0 more than once; give each once",
        ("grid", "--setups", "alibi", "nope", "alibi"): "--setups lists alibi more than once; give each once",
        ("grid", "--seeds", "-1"): "--seeds must be >= 0, got -1",
        ("grid", "--parallel", "0"): "--parallel must be >= 1, got 0",
        ("grid", "--config", "missing.yaml"): "missing.yaml not found (looked in ",
        ("grid", "--out", str(blocker / "out")): f"--out {blocker / 'out'} cannot be written (Not a directory); "
        "pass another --out",
        ("grid", "--out", str(runs / "summary")): f"--out {runs / 'summary'} and --runs {runs} overlap",
        ("grid", "--hours", "0"): "--hours must be > 0, got 0.0",
        ("conjecture", "--arms", "adam", "adam"): "--arms lists adam more than once",
        (
            "conjecture",
            "--arms",
            "lion",
        ): "unknown arms ['lion']; valid: adam, adam_tiny_eps, float64, float64_tiny_eps, sgd, decoder",
        ("conjecture", "--biases", "-3"): "bias '-3' must be >= 0",
        ("conjecture", "--biases", "huge"): "unknown bias 'huge'; valid: a number >= 0, tau, masked",
        (
            "conjecture",
            "--steps",
            "0",
        ): "--steps, --decoder-pretrain, --decoder-steps, --every and --decoder-every must be >= 1, got 0",
    }
    for (program, *options), line in refused.items():
        assert refusal([program, "--runs", str(runs), "--out", str(tmp_path / "out"), *options]).startswith(
            f"blindheads {program}: error: {line}"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"], "nothing was written"


def test_the_summary_goes_under_runs_by_default_and_committed_results_are_refused(tmp_path):
    """``blindheads grid`` once wrote into results/laptop: a summary folder holding results without a record of
    their options (committed ones), or made by a grid with other options, is refused."""
    assert grid.parse_args(["--runs", "runs/x/"]).out == "runs/x-summary"
    committed = shutil.copytree(REPO / "results/laptop", tmp_path / "results/laptop")
    command = ["grid", "--setups", "alibi", "--seeds", "0", "--runs", str(tmp_path / "runs")]
    assert refusal([*command, "--out", str(committed)]) == (
        f"blindheads grid: error: {committed} holds files made without a record of their options; remove it or pass "
        "another --out"
    )
    other = tmp_path / "other"
    before = grid.parse_args([*command[1:], "--out", str(other), "--setups", "nope"])
    claim(other, summary_identity(before, setup_files("nope", before.config)), "--out")
    assert f"{other} was made with other options (--setups nope -> alibi" in refusal([*command, "--out", str(other)])
    assert not (tmp_path / "runs").exists() and sorted(p.name for p in other.iterdir()) == ["options.json"]


def test_a_summary_is_replaced_whole_and_a_kill_mid_replace_is_undone(tmp_path, capsys):
    """A reader sees the old summary or the new one, never tables of one and results.json of the other."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("summary.md", "results.json", "options.json", "README.md"):
        (out / name).write_text("old")

    def failed(staging):
        (staging / "summary.md").write_text("new")
        raise KeyboardInterrupt  # a failure while writing the tables

    with pytest.raises(KeyboardInterrupt):
        publish(out, failed)
    old = dict.fromkeys(("summary.md", "results.json", "options.json", "README.md"), "old")
    assert {p.name: p.read_text() for p in out.iterdir()} == old and sorted(os.listdir(tmp_path)) == ["out"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f".out.partial-{dead.pid}").mkdir()  # what a driver killed while writing left

    def whole(staging):
        for name in ("summary.md", "results.json"):
            (staging / name).write_text("new")
        return "written"

    assert publish(out, whole) == "written"
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        "summary.md": "new",
        "results.json": "new",
        "options.json": "old",
        "README.md": "old",  # a person's notes on the results: no summary writes one, none removes it
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the killed driver's staging folder is gone"

    out.rename(tmp_path / ".out.previous-99999")  # killed between publish's two renames: no summary at all
    with owned(out, "grid", "--out"):
        assert (out / "summary.md").read_text() == "new" and (out / DRIVER_LOCK).read_text() == str(os.getpid())
    assert "restored" in capsys.readouterr().err and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_records_are_written_whole_and_a_truncated_one_is_named(tmp_path):
    path = tmp_path / "results.json"
    write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    path.write_text('{"a": ')
    with pytest.raises(ValueError, match=rf"{path} is not valid JSON .* remove it and run again"):
        read_json(path)


def test_every_results_file_records_the_command_seeds_machine_and_versions():
    from importlib.metadata import version

    from blindheads.experiments.driver.records import provenance

    record = provenance("blindheads grid --seeds 1 0", 12.345, [1, 0, 1])
    assert record["command"] == "blindheads grid --seeds 1 0" and record["wall_s"] == 12.3 and record["seeds"] == [0, 1]
    assert record["versions"]["torch"] == version("torch") and "CPUs" in record["machine"] and record["date"]


class NoJobs:
    """A driver for runs that are done: asked to run anything, it fails."""

    def launch(self, command, run_dir):
        raise AssertionError(f"{run_dir} was run again")


def test_a_done_run_is_not_run_again_whichever_marker_recorded_it(tmp_path):
    """``done.json`` marks a run done; so does the ``results.json`` an older grid left (its only marker then), as
    in the runs behind results/recall_by_distance/. A run with neither is run."""

    labels, out, wanted = {"setup": "nope", "seed": 0}, tmp_path / "out", identity([], [])
    grid_run, other_run = tmp_path / "grid/nope/seed0", tmp_path / "other/nope/seed0"
    write_json(grid_run / "results.json", {"setup": "nope", "seed": 0, "global_step": 3, "wall_s": 1.5})
    write_json(other_run / DONE, {"condition": "nope", "seed": 0, "wall_s": 2.5})
    assert complete(Run("nope", grid_run, labels, [], [], ("fit", "test")), NoJobs(), out, wanted)["global_step"] == 3
    assert complete(Run("nope", other_run, labels, [], []), NoJobs(), out, wanted)["wall_s"] == 2.5
    assert (out / "records/nope.json").is_file(), "a run found done in its directory is kept in the summary folder"
    with pytest.raises(AssertionError, match="was run again"):
        complete(Run("fresh", tmp_path / "fresh", labels, [], []), NoJobs(), out, wanted)


def test_a_record_kept_in_the_summary_folder_is_a_done_run_on_any_checkout(tmp_path):
    """A finished run's record goes to OUT/records/ at once: committed with the summary, it spares the run on a
    checkout without the run directory; made with other options, it is refused, naming the difference; past the
    deadline nothing new starts."""

    class Jobs:
        launched: list = []

        def launch(self, command, run_dir):
            self.launched.append(command)
            write_json(run_dir / "results.json", {"answer": 42})

    out, run = tmp_path / "out", Run("alibi seed 0", tmp_path / "runs/alibi/seed0", {"setup": "alibi"}, ["--a", "1"],
                                     [], ("conjecture-arm",))  # fmt: skip
    wanted = identity(run.options, [])
    record = complete(run, Jobs(), out, wanted)
    assert Jobs.launched == [["conjecture-arm", "--a", "1"]], "no checkpoint option for a non-Lightning command"
    kept = json.loads((out / "records/alibi-seed-0.json").read_text())
    assert kept == {"options": wanted, "run": "alibi seed 0", "digest": digest(record), "max_steps": None,
                    "record": record} and record["answer"] == 42  # fmt: skip
    shutil.rmtree(tmp_path / "runs")  # a fresh checkout: only the committed summary folder
    assert complete(run, Jobs(), out, wanted) == record and len(Jobs.launched) == 1
    with pytest.raises(RunChanged, match=r"records/alibi-seed-0.json was made with other options \(--a 1 -> 2\)"):
        complete(run, Jobs(), out, identity(["--a", "2"], []))
    late = Run("nope seed 0", tmp_path / "runs/nope/seed0", {"setup": "nope"}, [], [], ("conjecture-arm",))
    assert complete(late, Jobs(), out, identity([], []), deadline=0.0) is None and len(Jobs.launched) == 1


def test_a_summary_started_from_kept_records_alone_takes_each_that_matches_its_run(tmp_path):
    """An experiment whose setups or configs changed carries its finished runs into a new summary: a folder holding
    only ``records/`` is claimed, and each record still has to match its run's options."""
    out, run = tmp_path / "out", Run("alibi seed 0", tmp_path / "runs/alibi/seed0", {"setup": "alibi"}, ["--a", "1"],
                                     [], ("conjecture-arm",))  # fmt: skip
    wanted = identity(run.options, [])
    record = complete(run, DriverThatTests(0), out, wanted)
    shutil.rmtree(tmp_path / "runs")
    summary = identity(["--setups", "alibi", "nope"], [])
    claim(out, summary, "--out")  # records/ alone: taken on
    assert read_json(out / "options.json") == summary
    assert complete(run, DriverThatTests(0), out, wanted) == record
    (out / "options.json").unlink()
    (out / "summary.md").write_text("a table of the old summary")
    with pytest.raises(RunChanged, match="holds files made without a record of their options"):
        claim(out, summary, "--out")
    (tmp_path / "run/records").mkdir(parents=True)
    with pytest.raises(RunChanged, match="holds files made without a record of their options"):
        claim(tmp_path / "run", wanted)  # a run directory takes nothing on


class DriverThatTests:
    """A driver whose ``test`` writes the results of step ``step`` (and whose ``fit`` does nothing); it lists what
    it was asked to run."""

    def __init__(self, step: int) -> None:
        self.step, self.launched = step, []

    def launch(self, command, run_dir):
        self.launched.append(command)
        if command[0] == "test":
            write_json(run_dir / "results.json", {"global_step": self.step, "exact": 0.0})


def test_a_kept_record_that_does_not_match_its_run_is_rebuilt_from_it_or_refused(tmp_path, capsys):
    """Edited by hand (0.99 for 0.0), replaced by labels alone, malformed, naming another run, or without a digest:
    rebuilt from the run's done.json with a line saying so; with no run to rebuild it from, refused in one line, a
    record without a digest too (only those results/ commits are taken:
    test_records_digests.py)."""
    out, run = tmp_path / "out", Run("alibi seed 0", tmp_path / "runs/alibi/seed0", {"setup": "alibi", "seed": 0},
                                     ["--a"], [], ("test",))  # fmt: skip
    wanted, path = identity(run.options, []), tmp_path / "out/records/alibi-seed-0.json"
    record = complete(run, DriverThatTests(step=3), out, wanted)
    original = path.read_text()
    edited = json.loads(original)
    edited["record"]["exact"] = 0.99
    forged = {**edited, "digest": digest(edited["record"])}  # edited with a digest to match
    malformed = "is not a kept record (a JSON object with options, run, digest and record)"
    cases = [
        ("does not match its digest (edited by hand?)", edited),
        (malformed, {"setup": "alibi", "seed": 0}),
        (malformed, []),
        (malformed, {"record": {}}),
        ("does not match the record of its run", forged),
        ("is not valid JSON", '{"options": '),
        ("names the run 'nope seed 0', not 'alibi seed 0'", {**json.loads(original), "run": "nope seed 0"}),
        ("has no digest", {"options": wanted, "record": record}),
    ]
    for problem, kept in cases:
        path.write_text(kept) if isinstance(kept, str) else write_json(path, kept)
        capsys.readouterr()
        assert complete(run, NoJobs(), out, wanted) == record
        assert capsys.readouterr().out == f"{path} {problem}: rebuilt from the finished run in {run.directory}\n"
        assert path.read_text() == original, "rebuilt from the run"
    shutil.rmtree(tmp_path / "runs")  # a checkout with the summary folder alone: nothing to rebuild from
    write_json(path, edited)
    with pytest.raises(RunChanged) as refused:
        complete(run, NoJobs(), out, wanted)
    assert str(refused.value) == (
        f"{path} does not match its digest (edited by hand?), and {run.directory} holds no finished run to rebuild "
        "it from: remove it to run alibi seed 0 again"
    )
    write_json(path, {"options": wanted, "record": record})  # its digest removed, its run moved away
    with pytest.raises(RunChanged) as refused:
        complete(run, NoJobs(), out, wanted)
    assert str(refused.value) == (
        f"{path} has no digest, and {run.directory} holds no finished run to check it against: remove it to run "
        "alibi seed 0 again"
    )
    assert read_json(path) == {"options": wanted, "record": record}, "not adopted: no digest added"


def test_an_interrupted_run_tested_by_hand_resumes_to_its_max_steps(tmp_path, capsys):
    """SIGTERM to a grid left the run at step 102 of 400 (last.ckpt); ``blindheads test --ckpt_path last`` by hand
    wrote its results.json; the same grid command resumes the fit, not counting the run as done at step 102."""
    run = Run("alibi seed 0", tmp_path / "runs/alibi/seed0", {"setup": "alibi"}, ["--o"], [], ("fit", "test"))
    (run.directory / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 102}, run.directory / "checkpoints/last.ckpt")
    (run.directory / "config.yaml").write_text("trainer:\n  max_steps: 400\n")
    write_json(run.directory / "results.json", {"global_step": 102, "exact": 0.0})  # the test by hand
    out, wanted = tmp_path / "out", identity(run.options, [])
    driver = DriverThatTests(step=400)
    record = complete(run, driver, out, wanted)
    assert driver.launched == [["fit", "--o", "--ckpt_path", "last"], ["test", "--o", "--ckpt_path", "last"]]
    assert record["global_step"] == 400 and record["resumed"]
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{run.directory / 'results.json'} is of step 102, before the fit's max_steps 400 (an interrupted run tested "
        "by hand?): the run is not done, so it runs on"
    )
    kept = read_json(out / "records/alibi-seed-0.json")
    assert kept["max_steps"] == 400 and kept["record"]["global_step"] == 400
    kept["record"]["global_step"] = 102  # a kept record of the interrupted step: refused on a bare checkout
    write_json(out / "records/alibi-seed-0.json", {**kept, "digest": digest(kept["record"])})
    shutil.rmtree(tmp_path / "runs")
    with pytest.raises(RunChanged, match="is of step 102, before the fit's max_steps 400"):
        complete(run, NoJobs(), out, wanted)
