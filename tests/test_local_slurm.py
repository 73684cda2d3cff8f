"""``--launcher slurm`` against a real single-node SLURM started on this machine (``slurm/local-cluster.sh``: munged,
MariaDB, slurmdbd, slurmctld and slurmd on localhost): a two-run grid submitted as a job array, one job requeued
mid-run with ``scontrol requeue``, both finished and summarised. Skipped, with the reason, where SLURM cannot start."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from support.launchers import grid
from support.runs import REPO

from blindheads.cli import main
from blindheads.experiments.driver import launchers
from blindheads.experiments.driver.folders import JOBS


@pytest.fixture
def cluster(tmp_path_factory, monkeypatch):
    state = tmp_path_factory.mktemp("slurm")
    started = time.monotonic()
    up = subprocess.run([str(REPO / "slurm/local-cluster.sh"), "start", str(state)], capture_output=True, text=True)
    if up.returncode:
        pytest.skip(f"SLURM could not start here: {(up.stderr or up.stdout).strip().splitlines()[-1:]}")
    print(f"local SLURM started in {time.monotonic() - started:.1f} s")
    monkeypatch.setenv("SLURM_CONF", str(state / "slurm.conf"))
    yield state
    subprocess.run([str(REPO / "slurm/local-cluster.sh"), "stop", str(state)], check=False)


@pytest.mark.slow
@pytest.mark.usefixtures("jobs_see_the_tests")
def test_a_two_run_array_with_one_job_requeued_mid_run_finishes_and_is_summarised(tmp_path, cluster):
    command = grid(tmp_path, "runs", ["alibi", "nope"], 12, "--launcher", "slurm", "--launcher.cpus_per_task", "1")
    part = command.index("--")
    main(command)
    jobs = json.loads((tmp_path / "runs-summary" / JOBS).read_text())["jobs"]
    assert sorted(jobs) == ["alibi seed 0", "nope seed 0"] and all("_" in job["job_id"] for job in jobs.values())
    reached, deadline = tmp_path / "runs/alibi/seed0/reached", time.monotonic() + 300
    while not reached.exists():
        assert time.monotonic() < deadline, "the fit never reached step 3"
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", jobs["alibi seed 0"]["job_id"]], check=True)
    main([*command[:part], "--wait", *command[part:]])
    results = json.loads((tmp_path / "runs-summary/results.json").read_text())
    assert results["remaining"] == [] and [r["global_step"] for r in results["runs"]] == [12, 12]
    log = (tmp_path / "runs/alibi/seed0.fit.log").read_text()
    assert log.count("--- blindheads fit, started") == 2 and "resuming from" in log, log[-3000:]
    assert os.environ["SLURM_CONF"].startswith(str(cluster)) and launchers.POLL_S == 1.0
