"""Position setups, one config file each in ``configs/position/``: the only place a setup is written down.

An experiment adapts a setup to its scale with an overlay beside its config: for ``configs/experiments/laptop.yaml``,
``configs/experiments/laptop/SETUP.yaml`` (the sliding window at 1/8 of the paper's 1,024 tokens), composed after
the setup's own file.

Config paths are taken from the working directory where they exist there, else from the package's own configs
(``blindheads.packaged.located``), so the drivers work from any folder, installed or not (and runs started in the
checkout keep the relative names their ``options.json`` records).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from blindheads.packaged import located

POSITIONS = "configs/position"


def setup_names(directory: str | Path = POSITIONS) -> list[str]:
    """Every setup with a file in ``directory``, sorted."""
    return sorted(path.stem for path in Path(located(directory)).glob("*.yaml"))


def setup_files(name: str, experiment: list[str], directory: str | Path = POSITIONS) -> list[str]:
    """The config files of setup ``name`` in an experiment: the experiment's, the setup's, then the overlays the
    experiment's files keep for it."""
    overlays = [Path(config).with_suffix("") / f"{name}.yaml" for config in experiment]
    setup = Path(located(directory)) / f"{name}.yaml"
    return [*experiment, str(setup), *(str(o) for o in overlays if o.is_file())]


def position_of(files: list[str]) -> str:
    """The position spec these config files give the model (the last one that sets it wins, as in the CLI)."""
    spec = None
    for file in files:
        config = yaml.safe_load(Path(file).read_text()) or {}
        spec = config.get("model", {}).get("decoder", {}).get("position", spec)
    if spec is None:
        raise ValueError(f"no model.decoder.position in {files}")
    return spec


def position_setups(directory: str | Path = POSITIONS) -> dict[str, str]:
    """Setup name -> position spec, for every setup file in ``directory``."""
    return {name: position_of([str(Path(located(directory)) / f"{name}.yaml")]) for name in setup_names(directory)}
