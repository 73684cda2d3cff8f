"""``--launcher``: an experiment's runs as jobs of a submitit job array (``experiments.driver.launchers``): its
settings composed and refused in one line, a two-run grid submitted, reported and collected after the submitting
process has exited, and a job warned of its pre-emption that resumes and ends equal to an uninterrupted run."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.launchers import grid
from support.runs import REPO, refusal

from blindheads.cli import main
from blindheads.experiments.driver import launchers
from blindheads.experiments.driver.folders import JOBS


def parsed(tmp_path: Path, *options: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launchers.add_launcher_options(parser)
    return parser.parse_args(list(options))


def test_launcher_settings_compose_defaults_files_and_the_command_line(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("partition: gpu\ntimeout_min: 30\nsbatch: {account: lab}\n")
    args = parsed(tmp_path, "--launcher", "slurm", "--launcher-config", str(REPO / "configs/launcher/slurm.yaml"),
                  str(site), "--launcher.timeout_min", "45", "--launcher.sbatch", "qos=low")  # fmt: skip
    values = launchers.settings(args)
    assert values["gpus_per_node"] == values["tasks_per_node"] == 8, "slurm.yaml: one task per GPU"
    assert values["partition"] == "gpu" and values["timeout_min"] == 45 and values["sbatch"] == {"qos": "low"}
    assert launchers.settings(parsed(tmp_path))["nodes"] == 1, "defaults without a file"


@pytest.mark.parametrize(
    ("text", "options", "message"),
    [
        ("partitions: gpu\n", [], "unknown launcher setting 'partitions'; valid: partition, nodes"),
        ("nodes: two\n", [], "launcher setting nodes must be int, got 'two'"),
        ("- nodes\n", [], "is no mapping of settings"),
        ("", ["--launcher.timeout_min", "0"], "launcher setting timeout_min must be >= 1, got 0"),
        ("", ["--launcher.sbatch", "qos"], "--launcher.sbatch takes KEY=VALUE pairs, got qos"),
    ],
)
def test_bad_launcher_settings_are_refused_in_one_line(tmp_path, text, options, message):
    config = tmp_path / "launcher.yaml"
    config.write_text(text)
    with pytest.raises(ValueError, match="^.*$") as refused:
        launchers.settings(parsed(tmp_path, "--launcher-config", str(config), *options))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_grid_offers_both_launchers_and_refuses_hours_with_one(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["grid", "--help"])
    assert "--launcher {local,slurm}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="grid: error: --hours is for runs on this machine"):
        main(["grid", "--setups", "alibi", "--seeds", "0", "--runs", str(tmp_path / "runs"), "--launcher", "local",
              "--hours", "1"])  # fmt: skip


def test_slurm_missing_or_refusing_the_submission_is_one_line_that_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    """``--launcher slurm`` where SLURM is not installed was a 27-line traceback and left options.json in --runs
    and --out; an sbatch that refuses the array (an unknown partition) is one line too, and what the command made
    for the submission is removed (what was there before is kept)."""
    bin_dir, runs, out = tmp_path / "bin", tmp_path / "runs", tmp_path / "out"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no srun, no sbatch
    command = ["grid", "--setups", "alibi", "nope", "--seeds", "0", "--runs", str(runs), "--out", str(out),
               "--launcher", "slurm"]  # fmt: skip
    assert refusal(command) == (
        "blindheads grid: error: --launcher slurm: sbatch and srun not found on this machine (no SLURM here): run on "
        "a SLURM cluster's login node, or pass another launcher; valid: local, slurm (local: jobs on this machine)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"], "nothing written"
    for name, script in (
        ("srun", "exit 0"),
        (
            "sbatch",
            "echo 'sbatch: error: invalid partition specified: gpu' >&2\n"
            "echo 'sbatch: error: Batch job submission failed: Invalid partition name' >&2\nexit 1",
        ),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    (runs / "alibi").mkdir(parents=True)
    (runs / "alibi/notes.txt").write_text("a person's")  # there before: kept
    message = refusal([*command, "--launcher.partition", "gpu"])
    assert message == (
        "blindheads grid: error: --launcher slurm: submitting 2 runs failed (sbatch: error: invalid partition "
        "specified: gpu); nothing was submitted, and what this command wrote for it is removed; valid launchers: "
        "local, slurm"
    ), message
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.is_relative_to(bin_dir))
    assert left == ["runs", "runs/alibi", "runs/alibi/notes.txt"], left
    assert capsys.readouterr().err == "", "sbatch's own lines are not printed beside the one"


@pytest.mark.slow
def test_a_two_run_grid_is_submitted_then_reported_and_collected_by_a_later_command(tmp_path, jobs_see_the_tests):
    command = grid(tmp_path, "runs", ["alibi", "nope"], 3, "--launcher", "local")
    printed = tmp_path / "submitted.txt"
    with printed.open("w") as out:  # not a pipe: the jobs, which outlive the command, hold its output too
        code = subprocess.run([sys.executable, "-m", "blindheads", *command], stdout=out, stderr=subprocess.STDOUT,
                              timeout=120).returncode  # fmt: skip
    assert code == 0 and "2 queued, 0 running, 0 done, 0 failed of 2 runs" in printed.read_text(), printed.read_text()
    book = json.loads((tmp_path / "runs-summary" / JOBS).read_text())
    assert book["launcher"] == "local" and sorted(book["jobs"]) == ["alibi seed 0", "nope seed 0"]
    assert all(job["tries"] == 1 for job in book["jobs"].values())
    main([*command[: command.index("--")], "--wait", *command[command.index("--") :]])
    results = json.loads((tmp_path / "runs-summary/results.json").read_text())
    assert results["remaining"] == [] and [r["setup"] for r in results["runs"]] == ["alibi", "nope"]
    assert {r["global_step"] for r in results["runs"]} == {3}
    assert json.loads((tmp_path / "runs-summary" / JOBS).read_text()) == book, "no job submitted twice"


@pytest.mark.slow
def test_a_warned_job_saves_is_requeued_and_ends_equal_to_an_uninterrupted_run(tmp_path, jobs_see_the_tests, capsys):
    steps = 12
    uninterrupted = grid(tmp_path, "whole", ["alibi"], steps, "--launcher", "local")
    part = uninterrupted.index("--")
    main([*uninterrupted[:part], "--wait", *uninterrupted[part:]])
    [straight] = json.loads((tmp_path / "whole-summary/results.json").read_text())["runs"]
    command = grid(tmp_path, "warned", ["alibi"], steps, "--launcher", "local")
    main(command)
    assert not (tmp_path / "warned-summary/results.json").exists(), "submitted, not waited for"
    run_dir = tmp_path / "warned/alibi/seed0"
    deadline = time.monotonic() + 120
    while not (run_dir / "reached").exists():
        assert time.monotonic() < deadline, "the fit never reached step 3"
        time.sleep(0.2)
    job_id = json.loads((tmp_path / "warned-summary" / JOBS).read_text())["jobs"]["alibi seed 0"]["job_id"]
    [task] = Path(f"/proc/{job_id}/task/{job_id}/children").read_text().split()  # the job's process, under submitit's
    os.kill(int(task), signal.SIGUSR2)  # controller: the pre-emption warning SLURM sends it (--signal=USR2@N)
    main([*command[:part], "--wait", *command[part:]])
    [resumed] = json.loads((tmp_path / "warned-summary/results.json").read_text())["runs"]
    log = (tmp_path / "warned/alibi/seed0.fit.log").read_text()
    assert "resuming from" in log and log.count("--- blindheads fit, started") == 2, log[-3000:]
    assert resumed.get("resumed") is True and resumed["global_step"] == straight["global_step"] == steps
    loss, resumed_loss = straight["metrics"]["test/loss"], resumed["metrics"]["test/loss"]
    print(f"test/loss uninterrupted {loss!r}, warned and resumed {resumed_loss!r}")
    assert resumed["metrics"] == straight["metrics"], (loss, resumed_loss)
