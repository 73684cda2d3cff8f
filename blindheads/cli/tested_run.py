"""A tested run rebuilt for a second look: its decoder from ``last.ckpt`` (tensors only), its data module and the
evaluation callbacks asked for from its config, exactly as the run configured them (``blindheads recheck``,
``blindheads retrieval-heads``)."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.plugins.precision import Precision

from blindheads.checkpoints.reading import load_checkpoint
from blindheads.checkpoints.rebuild import checkpoint_decoder, decoder_config
from blindheads.cli.callback_set import KINDS
from blindheads.cli.lightning import build_cli
from blindheads.datamodules.text import TextData
from blindheads.experiments.driver.loop import done_record
from blindheads.running import running

CHECKPOINT = "checkpoints/last.ckpt"
CONFIGS = ("config.test.yaml", "config.yaml")  # what the test that wrote results.json ran with; the fit's
NOT_RUN_OPTIONS = ("ckpt_path", "weights_only", "verbose")  # the subcommand's own options, not the run's


@dataclass
class Loaded:
    """A tested run, rebuilt: its decoder (from the checkpoint), data module and evaluation callbacks (from its
    config), the trainer's precision plugin (the forward context the run evaluated in), and its test results."""

    run_dir: Path
    decoder: torch.nn.Module
    data: TextData
    callbacks: list[L.Callback]
    precision: Precision
    results: dict
    step: int


def run_config(run_dir: Path, kinds: tuple[type[L.Callback], ...], device: str | None = None) -> tuple[dict, str]:
    """The run's config as options for a CLI that only builds: the record of the test that wrote results.json
    (``config.test.yaml``), else of the fit (``config.yaml``; a grid tests with the fit's options), with the
    subcommand's own options (``ckpt_path``) dropped, no logger (nothing written), one device, and of the callbacks
    only those of ``kinds`` (refused if it has none); and the device: ``device``, else the run's (``cpu`` for a CPU
    run, else ``cuda`` where there is one), so a CPU run is re-evaluated with the CPU's arithmetic."""
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} has no config.yaml: not a blindheads run directory")
    path = next(p for p in (run_dir / name for name in CONFIGS) if p.is_file())
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(config, dict) or not isinstance(config.get("trainer"), dict):
        raise ValueError(f"{path} holds no trainer options: not a blindheads run config")
    for key in NOT_RUN_OPTIONS:
        config.pop(key, None)
    trainer = config["trainer"]
    names = {name for name, kind in KINDS.items() if kind in kinds}  # the callback set's names for them
    listed = trainer.get("callbacks") or []
    listed = [c for c in (listed if isinstance(listed, list) else [listed]) if _class_name(c) in _names(kinds)]
    chosen = config.get("callbacks")  # the callback set (``callbacks: use: [recall]``), in configs that have one
    used = [n for n in chosen.get("use") or [] if n in names] if isinstance(chosen, dict) else []
    if not listed + used:
        raise ValueError(f"{path} configures no {' or '.join(_names(kinds))} callback")
    if isinstance(chosen, dict):
        chosen["use"] = used
    if device is None:
        device = "cuda" if trainer.get("accelerator") != "cpu" and torch.cuda.is_available() else "cpu"
    trainer.update(callbacks=listed, logger=False, enable_checkpointing=False, devices=1, num_nodes=1,
                   strategy="auto", accelerator="cpu" if device == "cpu" else "gpu")  # fmt: skip
    return config, device


def _names(kinds: tuple[type[L.Callback], ...]) -> list[str]:
    return [kind.__name__ for kind in kinds]


def _class_name(callback) -> str | None:
    """A ``trainer.callbacks`` entry's class name."""
    return str(callback.get("class_path", "")).rpartition(".")[2] if isinstance(callback, dict) else None


def model_of(run_dir: Path, config: dict, checkpoint: dict) -> dict:
    """The checkpoint's decoder fields (checked against its weights), which the run's config must state as they are:
    a config edited after the run (8 heads for 4-head weights, an unknown field) is refused, naming what differs,
    before anything is built from it."""
    saved = asdict(decoder_config(checkpoint, run_dir / CHECKPOINT))
    model = config.get("model")
    stated = model.get("decoder") if isinstance(model, dict) else None
    stated = stated if isinstance(stated, dict) else {}
    differ = [
        f"model.decoder.{key}: {value!r} in the config, {saved[key]!r} in the checkpoint" if key in saved
        else f"model.decoder.{key}: unknown"
        for key, value in stated.items()
        if value is not None and (key not in saved or value != saved[key])
    ]  # fmt: skip
    if differ:
        raise ValueError(f"{run_dir}: its config's model differs from {CHECKPOINT}'s ({'; '.join(differ)}): the "
                         "config was edited after the run; restore it")  # fmt: skip
    return saved


def load_run(run_dir: str | Path, kinds: tuple[type[L.Callback], ...], device: str | None = None) -> Loaded:
    """The run rebuilt (see ``Loaded``); a directory that is no tested run is refused in one line."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    config, device = run_config(run_dir, kinds, device)
    results = done_record(run_dir)  # the grid's record of the test, else the test's results.json
    if results is None:
        raise FileNotFoundError(f"{run_dir} has no results.json: test the run first (blindheads test --ckpt_path last)")
    checkpoint = load_checkpoint(run_dir / CHECKPOINT)  # read_checkpoint: tensors and plain data only
    step = checkpoint.get("global_step", -1)
    if results.get("global_step") not in (None, step):
        raise ValueError(f"{run_dir}: results.json is of step {results['global_step']}, {CHECKPOINT} of step {step}: "
                         "the committed results are another checkpoint's")  # fmt: skip
    config["model"] = {**(config.get("model") or {}), "decoder": model_of(run_dir, config, checkpoint)}
    try:
        with warnings.catch_warnings():  # LightningCLI's advice against options both given and on sys.argv
            warnings.filterwarnings("ignore", message=r".*args parameter is intended to run from within Python")
            cli = build_cli(config, run=False)  # the data module and callbacks as the run's config makes them
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{run_dir}: its config does not rebuild: {first}") from None
    callbacks = [c for c in running(cli.trainer).callbacks if isinstance(c, kinds)]
    data = cli.datamodule
    data.prepare_data()
    data.setup("test")
    precision = cli.trainer.precision_plugin
    decoder = precision.convert_module(checkpoint_decoder(checkpoint)).to(device).eval()
    return Loaded(run_dir, decoder, data, callbacks, precision, results, step)
