"""``blindheads fit | validate | test``: LightningCLI over the decoder LM and the FineWeb-Edu data module."""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from copy import deepcopy
from pathlib import Path

from jsonargparse import ArgumentError
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from blindheads.arguments import class_path_error
from blindheads.callbacks.layout import TensorBoardLayout
from blindheads.callbacks.progress import count_steps_in_progress_bar
from blindheads.callbacks.results import ResultsFile
from blindheads.checkpoints import (
    check_regular_file,
    check_weights,
    config_from_fields,
    decoder_state,
    newest_intact,
    read_checkpoint,
    recorded_step,
)
from blindheads.cli import callback_set
from blindheads.cli.checkpoint_files import KeepWritingLast
from blindheads.cli.checkpoint_io import AtomicCheckpointIO, not_a_checkpoint
from blindheads.cli.checkpoint_options import check_precision, describe, is_typed, replaced_options, typed_options
from blindheads.cli.interrupts import Interrupted, SaveOnInterrupt, exit_after_interrupt, stopping_at_once
from blindheads.cli.rank_watchdog import watch_launcher
from blindheads.cli.run_config import RunConfig
from blindheads.cli.run_lock import RunLock
from blindheads.datamodules.fineweb import FineWebEdu
from blindheads.disk import check_writable
from blindheads.modules.config import SHAPE, DecoderConfig
from blindheads.modules.lm import DecoderLM, check_options
from blindheads.numerics import apply_threshold, check_trainer_precision

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
        callback_set.add_callback_set(parser)
        # The shape's defaults are unset, not the default preset's values: ``parse_arguments`` fills what no config or
        # option gives from ``size``, so ``size: tiny`` alone gives the tiny shape.
        parser.set_defaults({f"model.decoder.{name}": None for name in SHAPE})

    def parse_arguments(self, parser, args) -> None:
        """What the options mean is settled as soon as they are parsed, before anything reads them (``--ckpt_path
        last`` looks for the run directory, a checkpoint's options are compared with these): the logger's folders
        (``_check_run_names``), the optimiser's numbers, and the decoder's shape, filled from its ``size`` where not
        given, so the run's ``config.yaml`` records the shape the model has."""
        super().parse_arguments(parser, args)
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        _check_run_names(config)
        callback_set.check_used(config.callbacks)
        model = config.get("model") or {}
        check_options(model, prefix="--model.")
        decoder = model.get("decoder")
        if decoder is not None:
            applied = DecoderConfig(**{k: v for k, v in decoder.items() if k != "vocab_size" or v is not None})
            for name in SHAPE:
                decoder[name] = getattr(applied, name)

    def before_instantiate_classes(self) -> None:
        """The model's ``threshold`` sets the CPU's subnormal flag before any model or thread exists."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        decoder = config.get("model", {}).get("decoder")
        if decoder is not None:
            apply_threshold(decoder.get("threshold") or "normal")

    def _parse_ckpt_path(self) -> None:
        """LightningCLI reads the checkpoint's hyperparameters before anything else: ``last`` is resolved to the run's
        newest checkpoint first (or refused), and what cannot run from the checkpoint fails here, in one line, before
        any run directory is touched: a path that is no regular file (a FIFO or a device would never end), a file
        that is no checkpoint, a precision other than the checkpoint's dtype, a resume to a step before the
        checkpoint's."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        if config.get("ckpt_path") == "last":
            self._resolve_last()
        ckpt_path = config.get("ckpt_path")
        if ckpt_path is None:
            return
        if "://" not in str(ckpt_path):
            check_regular_file(ckpt_path)
        given = deepcopy(config.get("model"))
        try:
            super()._parse_ckpt_path()
        except ArgumentError as error:  # hyperparameters this model does not take (an unknown key)
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"{ckpt_path}: its hyperparameters do not fit the model: {first}") from None
        except Exception as error:
            raise ValueError(not_a_checkpoint(ckpt_path, error)) from None
        config = self.config[subcommand]  # parsing the checkpoint's options made a new namespace
        self._name_replaced_options(replaced_options(given, config.get("model")))
        check_precision(config.trainer.get("precision"), config.model.decoder.dtype, ckpt_path)
        if "://" not in str(ckpt_path):  # the model to be built must hold the checkpoint's weights: checked first
            decoder = config.model.decoder
            fields_ = decoder.as_dict() if hasattr(decoder, "as_dict") else dict(decoder)
            checkpoint = read_checkpoint(ckpt_path, mmap=True)
            if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
                raise ValueError(not_a_checkpoint(ckpt_path, KeyError("state_dict")))
            config_ = config_from_fields(fields_, f"{ckpt_path}: its decoder config")
            check_weights(config_, decoder_state(checkpoint), ckpt_path)
        step, max_steps = recorded_step(Path(ckpt_path)), config.trainer.get("max_steps")
        if subcommand == "fit" and step is not None and max_steps is not None and 0 <= max_steps < step:
            raise ValueError(  # an equal one is a finished run's resume (a killed grid's rerun): it ends at once
                f"--trainer.max_steps {max_steps} is below the checkpoint's step {step} ({ckpt_path}): a resume trains "
                f"on from there to --trainer.max_steps, so give more steps; validate or test evaluate the checkpoint"
            )

    def _name_replaced_options(self, replaced: list) -> None:
        """A typed model option the checkpoint replaces is refused; one from a config file is logged. The command's
        config record (``run_config``) holds the values used."""
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
        ``results.json``. The model's ``dtype`` must be what the trainer's precision computes in, as Lightning
        resolved it (it substitutes some precisions on some accelerators). The used ``callbacks`` run first, then
        ``trainer.callbacks``: the config keeps the two apart, so a run's ``config.yaml`` rebuilds each once."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        plugins = trainer_config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        listed = trainer_config.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        trainer_config["callbacks"] = [*callback_set.instantiate(self._get(self.config_init, "callbacks")), *listed]
        configured = list(trainer_config["callbacks"])  # the Trainer appends its defaults to this list
        trainer = super().instantiate_trainer(plugins=[AtomicCheckpointIO(), *plugins], **kwargs)
        count_steps_in_progress_bar(trainer, configured)
        requested = self._get(self.config, "trainer", default={}).get("precision") or "32-true"
        check_trainer_precision(str(requested), trainer.precision, self.model.config.dtype)
        trainer.callbacks.insert(0, RunLock())  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
        trainer.callbacks.append(TensorBoardLayout())  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
        if self.subcommand == "fit":
            trainer.callbacks += [SaveOnInterrupt(), KeepWritingLast()]  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
        if self.subcommand == "test":
            trainer.callbacks.append(ResultsFile())  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
        return trainer

    def before_fit(self) -> None:
        """A fit from scratch into a run directory that holds another run is refused before Lightning's set-up
        writes anything there (``RunConfig.refuse_a_second_run``)."""
        log_dir = self.trainer.log_dir
        if self.config.fit.get("ckpt_path") is None and log_dir is not None:
            for callback in self.trainer.callbacks:  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
                if isinstance(callback, RunConfig):
                    callback.refuse_a_second_run(Path(log_dir))

    def _run_subcommand(self, subcommand: str) -> None:
        """A run refused before its first step leaves no run directory behind (``RunLock``)."""
        try:
            super()._run_subcommand(subcommand)
        finally:
            for callback in self.trainer.callbacks:  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
                if isinstance(callback, RunLock):
                    callback.remove_discarded()

    def after_test(self) -> None:
        """``test`` ends with the short report (after Lightning's table of every metric, when ``--verbose``)."""
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]  # undeclared: Lightning sets it at run time
            if isinstance(callback, ResultsFile) and callback.report:
                print("\n" + "\n".join(callback.report), flush=True)


def _check_run_names(config) -> None:
    """A logger's ``save_dir``, ``name`` and ``version`` become the run's folders. ``$VAR`` and ``~`` in them are
    expanded here, once, as a user expects (TensorBoard expands its own log path, while checkpoints, the run lock and
    ``--ckpt_path last`` would take them literally): a variable that is not set is refused. So are a name the file
    system cannot hold and a ``save_dir`` that cannot be written, before any run."""
    loggers = config.get("trainer", {}).get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        args = getattr(logger, "init_args", None) if logger not in (None, True, False) else None
        if args is None:
            continue
        for key in ("save_dir", "name", "version"):
            value, option = args.get(key), f"--trainer.logger.init_args.{key}"
            if not isinstance(value, str):
                continue
            expanded = os.path.expandvars(os.path.expanduser(value) if key == "save_dir" else value)
            unset = re.findall(r"\$\{?(\w+)", expanded)
            if unset:
                raise ValueError(
                    f"{option} {value}: environment variable {unset[0]} is not set; set it, or give the path"
                )
            if key != "save_dir" and len(expanded.encode()) > 255:
                raise ValueError(f"{option} is {len(expanded.encode())} bytes long: a folder name holds at most 255")
            args[key] = expanded
        if args.get("save_dir") is not None:
            check_writable(args.save_dir, "--trainer.logger.init_args.save_dir")


def build_cli(args: list[str] | dict | None, run: bool = True) -> BlindheadsCLI:
    """The CLI over ``args`` (a subcommand first when ``run``; a config as a dict when not); ``run=False`` only
    parses and instantiates."""
    return BlindheadsCLI(
        DecoderLM,
        FineWebEdu,
        args=args,
        run=run,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_callback=RunConfig,  # config.yaml records the fit that made the run; later commands write beside it
        save_config_kwargs={"overwrite": True},
        # no prefixes: --trainer.max_step is a typo, not --trainer.max_steps
        # errors raise (main prints them in a few lines, not a usage dump)
        parser_kwargs={
            "allow_abbrev": False,
            "exit_on_error": False,
            **{cmd: {"allow_abbrev": False, "exit_on_error": False} for cmd in ("fit", "validate", "test")},
        },
    )


def fit(argv: list[str]) -> None:
    main(["fit", *argv])


def validate(argv: list[str]) -> None:
    main(["validate", *argv])


def test(argv: list[str]) -> None:
    main(["test", *argv])


def main(argv: list[str]) -> BlindheadsCLI:
    watch_launcher()
    # Lightning 2.6 warns about its own use of torch's pytree API on every fit: noise, not the user's concern
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    try:  # From the console script the arguments are sys.argv's; LightningCLI warns when given both.
        with stopping_at_once():
            return build_cli(None if argv == sys.argv[1:] else argv)
    except (SIGTERMException, Interrupted, KeyboardInterrupt) as stop:
        exit_after_interrupt(stop)
    except ArgumentError as error:
        sys.exit(short_error(argv[0] if argv else "", error))


def short_error(subcommand: str, error: Exception, most_lines: int = 8) -> str:
    """A command-line or config mistake in a few lines and a pointer to ``--help``, instead of the whole usage."""
    short = class_path_error(str(error))
    lines = [short] if short else [line for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > most_lines:
        lines = [*lines[:most_lines], f"... ({len(lines) - most_lines} more lines)"]
    return "\n".join([f"blindheads {subcommand}: error: {lines[0] if lines else error}", *lines[1:],
                      f"see: blindheads {subcommand} --help"])  # fmt: skip
