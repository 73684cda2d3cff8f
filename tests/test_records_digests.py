"""A finished run's record is what its run wrote: a ``done.json`` edited by hand (or removed) is named, in one line
with what differs, and restored from the kept record where that matches what the run wrote (its digest
``done.sha256``, the ``results.json`` its test wrote), else refused; so neither file alone changes a summary. Every
record results/ commits is still taken; a killed writer's partial record in ``records/`` is removed, saying so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from support.runs import REPO

from blindheads.cli import grid
from blindheads.experiments.driver.identity import RunChanged, identity
from blindheads.experiments.driver.jobs import Driver
from blindheads.experiments.driver.loop import DONE, SEALED, TESTED, Run, complete, digest, kept_record
from blindheads.experiments.driver.records import read_json, write_json

TESTED_LOSS = 6.65  # what the run's test wrote


class Tests:
    """A driver whose ``test`` writes a loss to ``results.json`` (and whose ``fit`` does nothing)."""

    def launch(self, command, run_dir):
        if command[0] == "test":
            write_json(run_dir / TESTED, {"global_step": 3, "metrics": {"test/loss": TESTED_LOSS, "test/x": 1.0}})


class NoJobs:
    def launch(self, command, run_dir):
        raise AssertionError(f"{run_dir} was run again")


def edit(path, change):
    record = read_json(path)
    change(record)
    write_json(path, record)


def finished_run(tmp_path):
    run = Run("alibi seed 0", tmp_path / "runs/alibi/seed0", {"setup": "alibi", "seed": 0}, ["--a"], [],
              ("fit", "test"))  # fmt: skip
    out, wanted = tmp_path / "out", identity(run.options, [])
    record = complete(run, Tests(), out, wanted)
    return run, out, wanted, record


def test_records_an_edited_done_json_is_restored_from_the_kept_record_or_refused(tmp_path, capsys):
    run, out, wanted, record = finished_run(tmp_path)
    done, kept = run.directory / DONE, out / "records/alibi-seed-0.json"
    original, tested = done.read_text(), run.directory / TESTED
    assert (run.directory / SEALED).is_file() and record["metrics"]["test/loss"] == TESTED_LOSS
    restored = f": restored from {kept}, which matches what the run wrote\n"

    capsys.readouterr()
    edit(done, lambda r: r["metrics"].update({"test/loss": 0.1}))  # a number the test wrote
    assert complete(run, NoJobs(), out, wanted) == record
    assert capsys.readouterr().out == (
        f"{done} does not match {tested}, which its test wrote (metrics.test/loss 0.1, not 6.65){restored}"
    )
    assert done.read_text() == original, "done.json restored"

    edit(done, lambda r: r.update({"wall_s": 9999.0, "curves": {"recall": {}}}))  # what no test wrote: its digest
    assert complete(run, NoJobs(), out, wanted) == record
    assert capsys.readouterr().out == (
        f"{done} does not match its digest in {run.directory / SEALED}, written as the run ended (edited by hand?)"
        f"{restored}"
    )
    done.unlink()  # removed beside its digest: not a run made before done.json
    assert complete(run, NoJobs(), out, wanted) == record and done.read_text() == original
    assert (
        capsys.readouterr().out
        == f"{done} is missing beside its digest in {run.directory / SEALED} (removed?){restored}"
    )

    edit(tested, lambda r: r["metrics"].update({"test/loss": 9.0}))  # results.json alone: done.json is as written
    assert complete(run, NoJobs(), out, wanted) == record and capsys.readouterr().out == ""
    edit(tested, lambda r: r["metrics"].update({"test/loss": TESTED_LOSS}))

    (run.directory / SEALED).unlink()  # a run finished before digests were written: results.json decides
    edit(done, lambda r: r["metrics"].update({"test/loss": 0.1}))
    assert complete(run, NoJobs(), out, wanted) == record and capsys.readouterr().out.endswith(restored)
    (run.directory / SEALED).unlink()
    edit(tested, lambda r: r["metrics"].update({"test/loss": 9.0}))  # then results.json alone: which is right?
    with pytest.raises(RunChanged) as refused:
        complete(run, NoJobs(), out, wanted)
    assert str(refused.value) == (
        f"{done} does not match {tested}, which its test wrote (metrics.test/loss 6.65, not 9.0), and {kept} does not "
        f"match {tested}, which its test wrote (metrics.test/loss 6.65, not 9.0): restore the file edited, or remove "
        f"{run.directory} to run alibi seed 0 again"
    )
    assert read_json(kept)["record"] == record, "the kept record is left as it was"


def test_records_an_edited_done_json_with_no_kept_record_to_match_is_refused(tmp_path):
    run, out, wanted, _ = finished_run(tmp_path)
    done, kept = run.directory / DONE, out / "records/alibi-seed-0.json"
    edit(done, lambda r: r["metrics"].update({"test/loss": 0.1}))
    expected = f"{done} does not match {run.directory / TESTED}, which its test wrote (metrics.test/loss 0.1, not 6.65)"
    edited = read_json(kept)
    edited["record"]["metrics"]["test/loss"] = 0.1  # both edited, the kept one with a digest to match
    write_json(kept, {**edited, "digest": digest(edited["record"])})
    for case in ("edited to match", "missing"):
        with pytest.raises(RunChanged) as refused:
            complete(run, NoJobs(), out, wanted)
        assert str(refused.value).startswith(f"{expected}, and {kept} "), case
        assert "\n" not in str(refused.value) and str(refused.value).endswith("to run alibi seed 0 again")
        kept.unlink(missing_ok=True)
    assert "does not exist to restore it from" in str(refused.value)
    assert read_json(done)["metrics"]["test/loss"] == 0.1, "nothing was taken or rewritten from the edited file"


def test_records_a_grid_run_whose_done_json_was_edited_keeps_its_tested_numbers_in_the_summary(
    tmp_path, monkeypatch, capsys
):
    """The issue's case: test/loss set to 0.1 in a finished run's done.json, the grid run again: the summary keeps
    the 6.65 its test wrote, and says why."""

    def launch(self, command, run_dir):
        Tests().launch(command, run_dir)

    monkeypatch.setattr(Driver, "launch", launch)
    out, runs = tmp_path / "out", tmp_path / "runs"
    command = ["--setups", "alibi", "--seeds", "0", "--runs", str(runs), "--out", str(out)]
    grid.main(command)
    done = runs / "alibi/seed0" / DONE
    edit(done, lambda r: r["metrics"].update({"test/loss": 0.1}))
    monkeypatch.setattr(Driver, "launch", NoJobs.launch)
    capsys.readouterr()
    grid.main(command)
    [summarised] = read_json(out / "results.json")["runs"]
    assert summarised["metrics"]["test/loss"] == TESTED_LOSS and read_json(done)["metrics"]["test/loss"] == 6.65
    assert f"{done} does not match {runs / 'alibi/seed0' / TESTED}, which its test wrote (metrics.test/loss 0.1, " \
        "not 6.65): restored from" in capsys.readouterr().out  # fmt: skip


def test_records_every_record_results_commits_is_taken_without_its_run_and_none_without_its_digest(tmp_path):
    """Each committed record carries the SHA-256 of its record: taken on a checkout without the runs; the same record
    with its digest deleted is refused."""
    committed = sorted(REPO.glob("results/*/records/*.json"))
    assert len(committed) > 100
    for source in committed:
        path = tmp_path / source.relative_to(REPO)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, path)
        kept = read_json(path)
        assert "digest" in kept, source
        run = Run(kept["run"], tmp_path / "runs" / path.stem, {}, kept["options"]["options"], [])
        assert kept_record(path, kept["options"], run) == kept["record"], source
    del kept["digest"]
    path.write_text(json.dumps(kept))
    with pytest.raises(RunChanged, match="has no digest"):
        kept_record(path, kept["options"], run)


def test_records_a_partial_record_left_by_a_killed_write_is_removed_at_the_next_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Driver, "launch", lambda self, command, run_dir: Tests().launch(command, run_dir))
    out, records = tmp_path / "out", tmp_path / "out/records"
    dead = subprocess.Popen(["true"])
    dead.wait()
    records.mkdir(parents=True)
    partial = records / f".alibi-seed-0.json.partial-{dead.pid}"  # atomic.staging_path's name, its writer gone
    partial.write_text('{"options": ')
    live = records / f".nope-seed-0.json.partial-{os.getpid()}"  # a live writer's: left alone
    other = records / "notes.partial-1"  # not the project's naming: left alone
    live.write_text("")
    other.write_text("")
    grid.main(["--setups", "alibi", "--seeds", "0", "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert (
        f"blindheads grid: removed {partial}, a record left part-written by a killed driver" in capsys.readouterr().err
    )
    assert sorted(p.name for p in records.iterdir()) == sorted([live.name, other.name, "alibi-seed-0.json"])


def test_records_a_summary_folder_holding_only_its_readme_is_claimed_and_the_readme_kept(tmp_path, monkeypatch):
    """An experiment's design and decision rule are written before its runs: a summary folder holding only that
    README.md is taken, and the summary leaves it as it was; any other file still refuses the folder."""
    monkeypatch.setattr(Driver, "launch", lambda self, command, run_dir: Tests().launch(command, run_dir))
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("# the rule, stated before the runs\n")
    grid.main(["--setups", "alibi", "--seeds", "0", "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert (out / "README.md").read_text() == "# the rule, stated before the runs\n"
    assert (out / "records" / "alibi-seed-0.json").exists() and (out / "summary.md").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "README.md").write_text("notes\n")
    (other / "summary.md").write_text("someone's table\n")
    with pytest.raises(RunChanged, match="holds files made without a record of their options"):
        grid.main(["--setups", "alibi", "--seeds", "0", "--runs", str(tmp_path / "runs2"), "--out", str(other)])
