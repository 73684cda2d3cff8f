import os
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from support.launchers import jobs_see_the_tests  # noqa: F401 -- a fixture for the launcher tests
from support.runs import run_cli, tiny_run_args

from blindheads.datamodules.tokenizer import load_tokenizer

# Under ``-n N`` the xdist workers already fill the cores: each computes on one thread, and the CLI subprocesses it
# starts inherit OMP_NUM_THREADS=1 (test_blindness_vs_softmax, test_zero_free and test_episode_recall under -n 2 on
# 2 shared cores: 187 and 174 s wall against 268 and 221 s with torch's default threads, runs alternated). A run
# without workers (``-n 0``) keeps torch's default threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)

# The CPU's flush-to-zero flag is per thread, and a new intra-op thread copies its creator's. A CLI built in-process
# sets the flag from its config before any thread starts; were the thread pool started then, its threads would flush
# subnormals for the rest of the session whatever the main thread resets. Start the pool now, subnormals kept.
torch.set_flush_denormal(False)
torch.zeros(1 << 22).exp_()


def pytest_collection_modifyitems(items):
    """Slow tests first: under ``-n 2`` (tests handed out one at a time, ``--maxschedchunk=1`` in pyproject.toml) a
    minutes-long test started last would leave the other worker idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _keep_subnormals_after_each_test():
    """A CLI built in the test process sets the CPU's subnormal flag from its config's threshold; the next test
    starts from the process default (subnormals kept) again."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """A cache holding the builtin corpus and tokenizer, built once per test session."""
    path = tmp_path_factory.mktemp("blindheads-cache")
    load_tokenizer("builtin", path)
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, cache_dir) -> Path:
    """One tiny 20-step fit with every evaluation (``tiny_run_args(..., evaluations=True)``, ALiBi, version ``run``),
    made once per session and shared by the xdist workers. Tests read it or copy it (``support.runs.copy_run``),
    never change it. Returns the run directory (``.../alibi/run``)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    root = shared / "trained-run"
    with FileLock(str(shared / "trained-run.lock")):
        run_dir = root / "alibi" / "run"
        if not (run_dir / "checkpoints" / "last.ckpt").exists():
            args = tiny_run_args(root, cache_dir, evaluations=True, **{"--trainer.logger.init_args.version": "run"})
            fit = run_cli(["fit", *args])
            assert fit.returncode == 0, fit.stderr[-3000:]
    return run_dir
