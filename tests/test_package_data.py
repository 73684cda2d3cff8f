"""The config files the code reads itself travel with the package (``blindheads.packaged``): the callbacks' defaults
are the repository's file, committed runs keep their identity, and a wheel installed outside the checkout runs a
user's copied config from any folder."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support.runs import REPO

from blindheads.experiments.driver.identity import identity
from blindheads.experiments.grid.setups import setup_names
from blindheads.packaged import CALLBACK_DEFAULTS, located, packaged

# A committed run of the grid: its record holds the identity it was made with (``experiments.loop.keep``).
COMMITTED = REPO / "results/recall_by_distance/records/alibi-seed-0.json"


def test_the_packaged_callback_defaults_are_the_repositorys_file():
    assert packaged(CALLBACK_DEFAULTS) == REPO / "configs/callbacks/base.yaml"
    assert packaged(CALLBACK_DEFAULTS).read_bytes() == (REPO / "configs/callbacks/base.yaml").read_bytes()


def test_a_committed_runs_identity_is_the_one_it_recorded(monkeypatch):
    """The callbacks' defaults are keyed and hashed as when the committed runs were made: else every committed
    experiment would refuse to resume."""
    monkeypatch.chdir(REPO)
    recorded = json.loads(COMMITTED.read_text())["options"]
    options = recorded["options"]
    files = [value for flag, value in itertools.pairwise(options) if flag == "--config"]
    assert identity(options, files, recorded["env"]) == recorded
    assert identity([], [])["configs"] == {"configs/callbacks/base.yaml": "9cf468dcfc280daf"}


def test_setups_and_experiment_configs_are_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert located("configs/experiments/laptop.yaml") == str(REPO / "configs/experiments/laptop.yaml")
    assert setup_names() == sorted(p.stem for p in (REPO / "configs/position").glob("*.yaml"))
    with pytest.raises(FileNotFoundError, match=r"configs/nothing.yaml not found \(looked in .* and in the package"):
        located("configs/nothing.yaml")


@pytest.mark.slow
def test_the_wheel_installed_elsewhere_fits_and_calculates_from_a_copied_config(tmp_path):
    """Built from the package's files alone, installed into a fresh environment (the dependencies this one's), run
    in a folder holding only a copy of ``configs/smoke.yaml``."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "blindheads", source / "blindheads", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(REPO / "configs", source / "configs")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "wheel"),
                    str(source)], check=True, capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True)
    env_python = tmp_path / "env/bin/python"
    site = Path(subprocess.run([env_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the wheel's own files
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True)
    alone = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # no checkout on the path
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(REPO / "configs/smoke.yaml", elsewhere / "smoke.yaml")

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [env_python, "-m", "blindheads", *argv], cwd=elsewhere, capture_output=True, text=True, env=alone
        )

    where = subprocess.run([env_python, "-c", "import blindheads; print(blindheads.__file__)"], cwd=elsewhere,
                           capture_output=True, text=True, env=alone).stdout  # fmt: skip
    assert where.startswith(str(site)), where
    printed = run("fit", "--config", "smoke.yaml", "--print_config")
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "save_last: true" in printed.stdout  # the callbacks' defaults, read from the installed package
    calculated = run("blindness", "--config", "smoke.yaml")
    assert calculated.returncode == 0, calculated.stderr[-2000:]
    assert "blind beyond" in calculated.stdout


def test_configs_and_code_that_name_fine_web_edu_get_the_data_module():
    """The data module is ``TextData`` (it also reads local files and the builtin corpus); its first name resolves
    wherever a class path names it."""
    from jsonargparse import Namespace
    from lightning.pytorch.cli import LightningArgumentParser

    from blindheads.datamodules import FineWebEdu
    from blindheads.datamodules.text import TextData

    assert FineWebEdu is TextData
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_argument("--data", type=TextData)
    parsed = parser.parse_args(["--data", '{"class_path": "blindheads.datamodules.FineWebEdu"}'])
    assert isinstance(parsed.data, Namespace)  # resolved: TextData's own options, with their defaults
    assert set(vars(parsed.data.init_args)) == set(inspect.signature(TextData).parameters)
