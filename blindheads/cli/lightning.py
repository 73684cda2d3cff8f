"""``blindheads fit | validate | test``: LightningCLI over the decoder LM and the FineWeb-Edu data module."""

from __future__ import annotations

import logging
import sys
import warnings
from copy import deepcopy
from pathlib import Path

import torch
from jsonargparse import ArgumentError
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blindheads.callbacks.layout import TensorBoardLayout
from blindheads.callbacks.results import ResultsFile
from blindheads.cli.checkpoint_files import newest_intact
from blindheads.cli.checkpoint_io import AtomicCheckpointIO, not_a_checkpoint
from blindheads.cli.checkpoint_options import describe, is_typed, replaced_options, typed_options
from blindheads.cli.interrupts import SaveOnInterrupt, exit_after_interrupt
from blindheads.cli.rank_watchdog import watch_launcher
from blindheads.cli.run_lock import RunLock
from blindheads.datamodules.fineweb import FineWebEdu
from blindheads.modules.config import SHAPE, DecoderConfig
from blindheads.modules.lm import DecoderLM
from blindheads.numerics import PRECISION_DTYPES

log = logging.getLogger(__name__)
TRAINER_DEFAULTS = {"gradient_clip_val": 1.0}


class BlindheadsCLI(LightningCLI):
    def __init__(self, *args, **kwargs) -> None:
        given = kwargs.get("args")
        self._typed = typed_options(sys.argv[1:] if given is None else given) if not isinstance(given, dict) else []
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        # The model's vocabulary is the tokenizer's (rounded up to a multiple of 64).
        parser.link_arguments(
            "data", "model.decoder.vocab_size", compute_fn=lambda data: data.vocab_size, apply_on="instantiate"
        )

    def before_instantiate_classes(self) -> None:
        """The numeric regime follows the model's config: its ``dtype`` must be the trainer precision's, and its
        ``threshold`` sets the CPU's subnormal flag before any model or thread exists. A decoder ``size`` replaces
        the shape fields in the parsed config itself, so the run's ``config.yaml`` records the shape the model has
        (``DecoderConfig`` applies it too, for Python users)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        _check_run_names(config)
        decoder = config.get("model", {}).get("decoder")
        if decoder is None:
            return
        precision = str(config.get("trainer", {}).get("precision") or "32-true")
        computes = PRECISION_DTYPES.get(precision)
        if computes is not None and computes != decoder.get("dtype"):
            raise ValueError(
                f"--trainer.precision {precision} computes attention in {computes}, but --model.decoder.dtype is "
                f"{decoder.get('dtype')} (its slopes, clamp floor and blindness predictions assume it): set "
                f"--model.decoder.dtype {computes}, or a precision that computes in {decoder.get('dtype')}"
            )
        apply_threshold(decoder.get("threshold") or "normal")
        if decoder.get("size"):
            applied = DecoderConfig(**{k: v for k, v in decoder.items() if k != "vocab_size" or v is not None})
            for name in SHAPE:
                decoder[name] = getattr(applied, name)

    def _parse_ckpt_path(self) -> None:
        """LightningCLI reads the checkpoint's hyperparameters before anything else: ``last`` is resolved to the run's
        latest ``last.ckpt`` first (or refused), and a file that is no checkpoint fails here, in one line."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        if self.config[subcommand].get("ckpt_path") == "last":
            self._resolve_last()
        given = deepcopy(self.config[subcommand].get("model"))
        try:
            super()._parse_ckpt_path()
        except Exception as error:
            raise ValueError(not_a_checkpoint(self.config[subcommand].get("ckpt_path"), error)) from None
        self._name_replaced_options(replaced_options(given, self.config[subcommand].get("model")))

    def _name_replaced_options(self, replaced: list) -> None:
        """A typed model option the checkpoint replaces is refused; one from a config file is logged. The run's
        ``config.yaml`` records the values used."""
        typed = [difference for difference in replaced if is_typed(difference[0], self._typed)]
        if typed:
            raise ValueError(
                "a checkpoint's run uses the checkpoint's model options, so these typed ones would be ignored: "
                + "; ".join(map(describe, typed))
                + ". Remove them (a new run with other options starts without "
                "--ckpt_path)"
            )
        for difference in replaced:
            log.warning(f"model option replaced by the checkpoint's: {describe(difference)}")

    def _resolve_last(self) -> None:
        """``--ckpt_path last`` means the run's newest intact checkpoint (``last.ckpt`` unless a save after it failed
        part-way, as on a full disk): in the logger's version directory when one is set, else in the newest
        ``version_N`` that has one, which the resumed run then keeps logging to."""
        config = self.config[self.config.subcommand]
        logger = config.trainer.get("logger")
        args = getattr(logger, "init_args", None) if logger not in (None, True, False) else None
        if args is None:
            raise ValueError("--ckpt_path last needs a logger (its run directory holds the checkpoints); give a path")
        run = Path(args.get("save_dir") or ".") / (args.get("name") or "lightning_logs")
        version = args.get("version")
        if version is not None:
            candidates = [run / (version if isinstance(version, str) else f"version_{version}")]
        else:
            numbered = [p for p in run.glob("version_*") if p.name.removeprefix("version_").isdigit()]
            candidates = sorted(numbered, key=lambda p: int(p.name.removeprefix("version_")), reverse=True)
        found = next(((c, ckpt) for c in candidates if (ckpt := newest_intact(c / "checkpoints"))), None)
        if found is None:
            looked = ", ".join(str(c / "checkpoints") for c in candidates[:3]) or f"{run}/version_*/checkpoints"
            raise ValueError(
                f"--ckpt_path last: no intact checkpoint in {looked}; give the checkpoint's path, or the run's "
                "version with --trainer.logger.init_args.version"
            )
        args.version = found[0].name
        config.ckpt_path = str(found[1])
        print(f"resuming from {config.ckpt_path}", file=sys.stderr)

    def instantiate_trainer(self, **kwargs):
        """Every run writes checkpoints atomically and holds its run directory; ``test`` also writes
        ``results.json``."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        plugins = trainer_config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        trainer = super().instantiate_trainer(plugins=[AtomicCheckpointIO(), *plugins], **kwargs)
        trainer.callbacks.insert(0, RunLock())  # first: before the config is saved into the run directory
        trainer.callbacks.append(TensorBoardLayout())
        if self.subcommand == "fit":
            trainer.callbacks.append(SaveOnInterrupt())
        if self.subcommand == "test":
            trainer.callbacks.append(ResultsFile())
        return trainer

    def _run_subcommand(self, subcommand: str) -> None:
        """A run refused before its first step leaves no run directory behind (``RunLock``)."""
        try:
            super()._run_subcommand(subcommand)
        finally:
            for callback in self.trainer.callbacks:
                if isinstance(callback, RunLock):
                    callback.remove_discarded()

    def after_test(self) -> None:
        """``test`` ends with the short report (after Lightning's table of every metric, when ``--verbose``)."""
        for callback in self.trainer.callbacks:
            if isinstance(callback, ResultsFile) and callback.report:
                print("\n" + "\n".join(callback.report), flush=True)


def _check_run_names(config) -> None:
    """The logger's name and version become folder names: refuse one the file system cannot hold, before any run."""
    logger = config.get("trainer", {}).get("logger")
    args = getattr(logger, "init_args", None) if logger not in (None, True, False) else None
    for key in ("name", "version"):
        value = args.get(key) if args is not None else None
        if isinstance(value, str) and (len(value.encode()) > 255):
            raise ValueError(
                f"--trainer.logger.init_args.{key} is {len(value.encode())} bytes long: a folder name holds at most 255"
            )


def apply_threshold(threshold: str) -> None:
    """``normal``: the CPU flushes subnormals, as fused GPU kernels do (and CPU arithmetic on them, which ALiBi's
    softmax is full of, is slow); ``subnormal``: it keeps them. Threads inherit the flag from the one that starts
    them, so it is set before the model or any worker exists."""
    torch.set_flush_denormal(threshold == "normal")


def build_cli(args: list[str] | None, run: bool = True) -> BlindheadsCLI:
    """The CLI over ``args`` (a subcommand first when ``run``); ``run=False`` only parses and instantiates."""
    return BlindheadsCLI(
        DecoderLM,
        FineWebEdu,
        args=args,
        run=run,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        # no prefixes: --trainer.max_step is a typo, not --trainer.max_steps
        # errors raise (main prints them in a few lines, not a usage dump)
        parser_kwargs={
            "allow_abbrev": False,
            "exit_on_error": False,
            **{cmd: {"allow_abbrev": False, "exit_on_error": False} for cmd in ("fit", "validate", "test")},
        },
    )


def main(argv: list[str]) -> BlindheadsCLI:
    watch_launcher()
    # Lightning 2.6 warns about its own use of torch's pytree API on every fit: noise, not the user's concern
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    try:  # From the console script the arguments are sys.argv's; LightningCLI warns when given both.
        return build_cli(None if argv == sys.argv[1:] else argv)
    except SIGTERMException:
        exit_after_interrupt()
    except ArgumentError as error:
        sys.exit(short_error(argv[0] if argv else "", error))


def short_error(subcommand: str, error: Exception, most_lines: int = 8) -> str:
    """A command-line or config mistake in a few lines and a pointer to ``--help``, instead of the whole usage."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > most_lines:
        lines = [*lines[:most_lines], f"... ({len(lines) - most_lines} more lines)"]
    return "\n".join([f"blindheads {subcommand}: error: {lines[0] if lines else error}", *lines[1:],
                      f"see: blindheads {subcommand} --help"])  # fmt: skip
