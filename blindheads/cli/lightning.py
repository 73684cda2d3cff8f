"""``blindheads fit | validate | test``: LightningCLI over the decoder LM and the text data module, with run safety
(``blindheads.runs``) delivered through LightningCLI's public hooks and the Trainer's callbacks and plugins."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

from jsonargparse import ArgumentError
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.environments import ClusterEnvironment, SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blindheads.arguments import class_path_error
from blindheads.callbacks.layout import TensorBoardLayout
from blindheads.callbacks.progress import StepProgressBar, shows_a_progress_bar
from blindheads.callbacks.results import ResultsFile
from blindheads.checkpoints.options import typed_options
from blindheads.cli import callback_set
from blindheads.datamodules.text import TextData
from blindheads.modules.config import SHAPE, DecoderConfig
from blindheads.modules.lm import DecoderLM, check_options
from blindheads.numerics import apply_threshold, check_trainer_precision
from blindheads.running import running
from blindheads.runs.config_records import RunConfig
from blindheads.runs.interrupts import stopping_at_once
from blindheads.runs.names import check_run_names
from blindheads.runs.resume import from_checkpoint
from blindheads.runs.safety import RunSafety
from blindheads.runs.watchdog import watch_launcher
from blindheads.signals import Interrupted, exit_after

TRAINER_DEFAULTS = {"gradient_clip_val": 1.0}


class BlindheadsCLI(LightningCLI):
    def __init__(self, *args, safety: RunSafety | None = None, **kwargs) -> None:
        given = kwargs.get("args")
        self._typed = typed_options(sys.argv[1:] if given is None else given) if not isinstance(given, dict) else []
        self.safety = safety or RunSafety()
        self.results = ResultsFile()
        super().__init__(*args, **kwargs)

    def _section(self, config):
        """The subcommand's options (``config`` itself without one)."""
        return config[config.subcommand] if config.get("subcommand") else config

    def add_arguments_to_parser(self, parser) -> None:
        # The model's vocabulary is the tokenizer's (rounded up to a multiple of 64).
        parser.link_arguments(
            "data", "model.decoder.vocab_size", compute_fn=lambda data: data.vocab_size, apply_on="instantiate"
        )
        callback_set.add_callback_set(parser)
        # The shape's defaults are unset, not the default preset's values: ``parse_arguments`` fills what no config or
        # option gives from ``size``, so ``size: tiny`` alone gives the tiny shape.
        parser.set_defaults({f"model.decoder.{name}": None for name in SHAPE})

    def parse_arguments(self, parser, args) -> None:
        """What the options mean is settled as soon as they are parsed, before anything reads them: the logger's
        folders (``runs.names``), the callbacks used, the optimiser's numbers, and the decoder's shape, filled from its
        ``size`` where not given, so the run's ``config.yaml`` records the shape the model has; then a run from a
        checkpoint takes its hyperparameters and is checked against it (``runs.resume``)."""
        super().parse_arguments(parser, args)
        config = self._section(self.config)
        check_run_names(config)
        callback_set.check_used(config.callbacks)
        model = config.get("model") or {}
        check_options(model, prefix="--model.")
        decoder = model.get("decoder")
        if decoder is not None:
            applied = DecoderConfig(**{k: v for k, v in decoder.items() if k != "vocab_size" or v is not None})
            for name in SHAPE:
                decoder[name] = getattr(applied, name)
        if self.config.get("subcommand"):
            self.config = from_checkpoint(parser, self.config, self._typed)

    def before_instantiate_classes(self) -> None:
        """The model's ``threshold`` sets the CPU's subnormal flag before any model or thread exists."""
        decoder = self._section(self.config).get("model", {}).get("decoder")
        if decoder is not None:
            apply_threshold(decoder.get("threshold") or "normal")

    def instantiate_trainer(self, **kwargs):
        """Every run holds its run directory first, writes checkpoints atomically, saves on a signal, and draws its
        TensorBoard layout; ``test`` also writes ``results.json``. The used ``callbacks`` run before
        ``trainer.callbacks``: the config keeps the two apart, so a run's ``config.yaml`` rebuilds each once. The
        model's ``dtype`` must be what the trainer's precision computes in, as Lightning resolved it (it substitutes
        some precisions on some accelerators)."""
        config = self._section(self.config_init)
        trainer_config = config.get("trainer") or {}
        plugins = trainer_config.get("plugins") or []
        listed = trainer_config.get("callbacks") or []
        configured = [*callback_set.instantiate(config.callbacks), *(listed if isinstance(listed, list) else [listed])]
        bar = [] if not shows_a_progress_bar(trainer_config, configured) else [StepProgressBar()]
        callbacks = [*self.safety.first_callbacks(), *configured, *bar, TensorBoardLayout(),
                     *self.safety.last_callbacks(), self.results]  # fmt: skip
        listed = plugins if isinstance(plugins, list) else [plugins]
        plugins = [self.safety.io, *listed, *submitit_slurm(listed)]
        trainer = super().instantiate_trainer(**{"callbacks": callbacks, "plugins": plugins, **kwargs})
        requested = self._section(self.config).get("trainer", {}).get("precision") or "32-true"
        check_trainer_precision(str(requested), trainer.precision, self.model.config.dtype)
        return trainer

    def before_fit(self) -> None:
        """A fit from scratch into a run directory that holds another run is refused before Lightning's set-up
        writes anything there (``RunConfig.refuse_a_second_run``)."""
        log_dir = self.trainer.log_dir
        if self.config.fit.get("ckpt_path") is None and log_dir is not None:
            for callback in running(self.trainer).callbacks:
                if isinstance(callback, RunConfig):
                    callback.refuse_a_second_run(Path(log_dir))

    def after_test(self) -> None:
        """``test`` ends with the short report (after Lightning's table of every metric, when ``--verbose``)."""
        if self.results.report:
            print("\n" + "\n".join(self.results.report), flush=True)


def build_cli(args: list[str] | dict | None, run: bool = True, safety: RunSafety | None = None) -> BlindheadsCLI:
    """The CLI over ``args`` (a subcommand first when ``run``; a config as a dict when not); ``run=False`` only
    parses and instantiates. A run refused before its first step leaves no run directory behind."""
    safety = safety or RunSafety()
    try:
        return BlindheadsCLI(
            DecoderLM,
            TextData,
            args=args,
            run=run,
            safety=safety,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_callback=RunConfig,  # config.yaml records the fit that made the run; later commands beside it
            save_config_kwargs={"overwrite": True},
            # no prefixes: --trainer.max_step is a typo, not --trainer.max_steps
            # errors raise (main prints them in a few lines, not a usage dump)
            parser_kwargs={
                "allow_abbrev": False,
                "exit_on_error": False,
                **{cmd: {"allow_abbrev": False, "exit_on_error": False} for cmd in ("fit", "validate", "test")},
            },
        )
    finally:
        safety.after_run()


def fit(argv: list[str]) -> None:
    main(["fit", *argv])


def validate(argv: list[str]) -> None:
    main(["validate", *argv])


def test(argv: list[str]) -> None:
    main(["test", *argv])


def main(argv: list[str]) -> BlindheadsCLI:
    watch_launcher()
    quiet_lightning()
    safety = RunSafety()
    try:  # From the console script the arguments are sys.argv's; LightningCLI warns when given both.
        with stopping_at_once():
            return build_cli(None if argv == sys.argv[1:] else argv, safety=safety)
    except (SIGTERMException, Interrupted, KeyboardInterrupt) as stop:
        exit_after(safety.interrupts.stopped or stop)
    except ArgumentError as error:
        sys.exit(short_error(argv[0] if argv else "", error))


def quiet_lightning() -> None:
    """Lightning's lines that are noise on every run, kept out of its output."""
    # Lightning 2.6 warns about its own use of torch's pytree API on every fit: not the user's concern
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(no_tips)  # its advertisement on every fit
    # a local fit on a machine with SLURM installed (a login node, a laptop rehearsing with slurm/): not a mistake
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")


def no_tips(record: logging.LogRecord) -> bool:
    """Lightning's "Tip:" lines (an advertisement for its cloud logger) kept out of the run's output."""
    return "Tip:" not in str(record.msg)


def short_error(subcommand: str, error: Exception, most_lines: int = 8) -> str:
    """A command-line or config mistake in a few lines and a pointer to ``--help``, instead of the whole usage."""
    short = class_path_error(str(error))
    lines = [short] if short else [line for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > most_lines:
        lines = [*lines[:most_lines], f"... ({len(lines) - most_lines} more lines)"]
    return "\n".join([f"blindheads {subcommand}: error: {lines[0] if lines else error}", *lines[1:],
                      f"see: blindheads {subcommand} --help"])  # fmt: skip


def submitit_slurm(listed: list) -> list:
    """A job of ``--launcher slurm`` (``experiments.driver.launchers``: submitit sets ``SUBMITIT_EXECUTOR``) has one
    requeue owner, submitit: Lightning's SLURM environment without its own SIGUSR1 requeue, where no cluster
    environment is among the ``listed`` plugins."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or any(isinstance(p, ClusterEnvironment) for p in listed):
        return []
    return [SLURMEnvironment(auto_requeue=False)]
