"""A run from a checkpoint (``--ckpt_path``), checked as soon as the options are parsed, before any run directory is
touched: ``last`` resolved to the run's newest intact checkpoint (or refused), then in one line each, a path that is
no regular file (a FIFO or a device would never end), a file that is no checkpoint, hyperparameters the model does
not take, a typed model option the checkpoint would replace, a precision other than the checkpoint's dtype, weights
that do not fit the model, a tokenizer whose vocabulary is not the model's, a resume to a step before the
checkpoint's. (Every fit's ``--trainer.max_steps``, from a checkpoint or not, is checked here too: a positive integer.)

The checkpoint's hyperparameters are merged into the options here, as LightningCLI merges them after parsing (it
finds them already there): the replaced options can then be named, and the checks read the options the run uses."""

from __future__ import annotations

import logging
import sys
from copy import deepcopy
from pathlib import Path

from jsonargparse import ArgumentError, Namespace

from blindheads.checkpoints.options import check_precision, describe, is_typed, replaced_options
from blindheads.checkpoints.reading import check_regular_file, newest_intact, not_a_checkpoint, read_checkpoint
from blindheads.checkpoints.rebuild import check_weights, decoder_state
from blindheads.datamodules.fingerprint import accepted_change, data_changed, differences
from blindheads.datamodules.tokenizer import default_cache_dir, load_tokenizer, padded_vocab_size, tokenizer_settings
from blindheads.modules.config import config_from_fields

log = logging.getLogger(__name__)


def from_checkpoint(parser, root: Namespace, typed: list[str]) -> Namespace:
    """The parsed options ``root`` (a subcommand's section under its name) with the checkpoint's hyperparameters
    merged in, every check above passed; ``typed``: the ``--model.*`` options typed on the command line."""
    subcommand = root.subcommand
    config = root[subcommand]
    if subcommand == "fit":
        check_max_steps(config.trainer.get("max_steps"))
    if config.get("ckpt_path") == "last":
        resolve_last(config, subcommand)
    ckpt_path = config.get("ckpt_path")
    if ckpt_path is None:
        return root
    local = "://" not in str(ckpt_path)  # a remote checkpoint is Lightning's to read
    checkpoint: dict = {}
    if local:
        check_regular_file(ckpt_path)
        checkpoint = read_checkpoint(ckpt_path)  # tensors and plain data only; one line otherwise
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
            raise ValueError(not_a_checkpoint(ckpt_path, KeyError("state_dict")))
    given = deepcopy(config.get("model"))
    root = with_hyperparameters(parser, root, checkpoint, ckpt_path)
    config = root[subcommand]
    name_replaced_options(replaced_options(given, config.get("model")), typed)
    check_precision(config.trainer.get("precision"), config.model.decoder.dtype, ckpt_path)
    if local:  # the model to be built must hold the checkpoint's weights: checked first
        decoder = config.model.decoder
        fields_ = decoder.as_dict() if hasattr(decoder, "as_dict") else dict(decoder)
        built = config_from_fields(fields_, f"{ckpt_path}: its decoder config")
        check_weights(built, decoder_state(checkpoint), ckpt_path)
        check_tokenizer(config.get("data"), checkpoint, built.vocab_size, ckpt_path, subcommand)
    step, max_steps = checkpoint.get("global_step") if local else None, config.trainer.get("max_steps")
    if subcommand == "fit" and step is not None and max_steps is not None and 0 <= max_steps < step:
        raise ValueError(  # an equal one is a finished run's resume (a killed grid's rerun): it ends at once
            f"--trainer.max_steps {max_steps} is below the checkpoint's step {step} ({ckpt_path}): a resume trains "
            f"on from there to --trainer.max_steps, so give more steps; validate or test evaluate the checkpoint"
        )
    return root


def check_max_steps(max_steps) -> None:
    """A fit's ``--trainer.max_steps`` must be a positive integer: the learning-rate schedule is sized from it, and
    Lightning's default, -1, trains without end. (Checked for every fit, from a checkpoint or not.)"""
    if max_steps is not None and max_steps >= 1:
        return
    unset = " (Lightning's default: not set, without end)" if max_steps in (None, -1) else ""
    raise ValueError(
        f"--trainer.max_steps {max_steps}{unset} must be a positive integer, the number of training steps: the "
        "learning-rate schedule is sized from it"
    )


def check_tokenizer(data, checkpoint: dict, vocab_size: int, ckpt_path, subcommand: str) -> None:
    """A tokenizer other than the checkpoint's run's (``data.tokenizer``, or the builtin one's
    ``data.builtin_vocab_size``) is refused in one line when its vocabulary is not the checkpoint's model's
    ``vocab_size`` (the weights would not load). Another builtin size of the same vocabulary is, on a fit, a change of
    the data as any other (refused unless ``data.accept_data_change``); the data module's fingerprint, compared when
    the fit restores its position, records the tokenizer's name and the rest of the data."""
    recorded = checkpoint.get("datamodule_hyper_parameters")
    if data is None or not isinstance(recorded, dict) or "tokenizer" not in recorded:
        return  # not a checkpoint of this data module: nothing recorded to compare
    before, after = tokenizer_settings(recorded), tokenizer_settings(data)
    compared = ["tokenizer"] if before["tokenizer"] != after["tokenizer"] else list(before)  # a size of the same one
    changed = differences({key: before[key] for key in compared}, {key: after[key] for key in compared})
    if not changed:
        return
    tokenizer = load_tokenizer(data.tokenizer, data.get("cache_dir") or default_cache_dir(), data.builtin_vocab_size)
    if (size := padded_vocab_size(tokenizer)) != vocab_size:
        restore = " ".join(f"--data.{key} {value}" for key, value in before.items() if data.get(key) != value)
        raise ValueError(
            f"the data changed since the checkpoint: {'; '.join(changed)}, a vocabulary of {size} tokens where the "
            f"checkpoint's model has {vocab_size} ({ckpt_path}): its weights cannot be loaded; give the "
            f"checkpoint's {restore}" + ", or start a new run without --ckpt_path" * (subcommand == "fit")
        )
    if subcommand == "fit" and before["tokenizer"] == after["tokenizer"]:  # the builtin one, of another size
        if not data.get("accept_data_change"):
            raise ValueError(data_changed(changed))
        log.warning(accepted_change(changed))


def with_hyperparameters(parser, root: Namespace, checkpoint: dict, ckpt_path) -> Namespace:
    """``root`` with the checkpoint's model hyperparameters in place of the given ones, parsed as LightningCLI parses
    them; hyperparameters this model does not take (an unknown key) are one line."""
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    if not hparams:
        return root
    if "_class_path" in hparams:
        hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
    try:
        return parser.parse_object({root.subcommand: {"model": hparams}}, root)
    except ArgumentError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{ckpt_path}: its hyperparameters do not fit the model: {first}") from None


def name_replaced_options(replaced: list, typed: list[str]) -> None:
    """A typed model option the checkpoint replaces is refused; one from a config file is logged. The command's
    config record (``config_records``) holds the values used."""
    refused = [difference for difference in replaced if is_typed(difference[0], typed)]
    if refused:
        raise ValueError(
            "a checkpoint's run uses the checkpoint's model options, so these typed ones would be ignored: "
            + "; ".join(map(describe, refused))
            + ". Remove them (a new run with other options starts without --ckpt_path)"
        )
    for difference in replaced:
        log.warning(f"model option replaced by the checkpoint's: {describe(difference)}")


def resolve_last(config, subcommand: str = "fit") -> None:
    """``--ckpt_path last`` means the run's newest intact checkpoint (``last.ckpt`` unless a save after it failed
    part-way, as on a full disk): in the logger's version directory when one is set, else in the newest
    ``version_N`` that has one, which the resumed run then keeps logging to."""
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
    doing = {"fit": "resuming from", "test": "testing", "validate": "validating"}.get(subcommand, f"{subcommand}:")
    print(f"{doing} {config.ckpt_path}", file=sys.stderr)  # which checkpoint ``last`` found
