"""What a checkpoint's hyperparameters replace: LightningCLI runs ``fit`` resumes, ``validate`` and ``test`` with the
checkpoint's model options, whatever the command line or config files say. Each replaced option is named: one typed
on the command line is refused (the user asked for a value the run would not use), one from a config file or a
default is logged beside the value used. The precision must follow the checkpoint's ``dtype``, which it keeps."""

from __future__ import annotations

from typing import Any

from blindheads.numerics import PRECISION_DTYPES

Difference = tuple[str, Any, Any]  # option, value given, value the checkpoint imposes


def flatten(options: Any, prefix: str) -> dict[str, Any]:
    """Nested option dicts (and jsonargparse Namespaces) as ``{"model.decoder.dtype": value}``; a list of mappings
    (callbacks) by position, ``{"trainer.callbacks.0.init_args.every_n_steps": value}``."""
    if hasattr(options, "as_dict"):
        options = options.as_dict()
    if isinstance(options, list) and options and all(isinstance(item, dict) for item in options):
        options = dict(enumerate(options))
    if not isinstance(options, dict):
        return {prefix: options}
    flat = {}
    for key, value in options.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def replaced_options(given: Any, used: Any, prefix: str = "model") -> list[Difference]:
    """Every option whose given value the checkpoint's replaces, in a stable order."""
    before, after = flatten(given, prefix), flatten(used, prefix)
    missing = object()
    return [
        (key, before.get(key, missing), after.get(key, missing))
        for key in sorted(before | after)
        if before.get(key, missing) != after.get(key, missing) and key in before
    ]


def typed_options(args: list[str]) -> list[str]:
    """The ``--model.*`` options typed on a command line (``--model.lr 1e-4`` or ``--model.lr=1e-4``)."""
    return [arg[2:].split("=")[0].rstrip("+") for arg in args if arg.startswith("--model.") or arg == "--model"]


def is_typed(option: str, typed: list[str]) -> bool:
    """Whether ``option`` was set by a typed one (itself, or a parent such as ``--model.decoder``)."""
    return any(option == t or option.startswith(f"{t}.") for t in typed)


def describe(difference: Difference) -> str:
    option, given, used = difference
    return f"{option}: {given!r} given, the checkpoint's {used!r} used"


def check_precision(precision: Any, dtype: str, ckpt_path: str) -> None:
    """A run from a checkpoint keeps its ``dtype`` (a model option, refused when typed): only the trainer precision
    can follow it, so that is the one change to ask for."""
    precision = str(precision or "32-true")
    computes = PRECISION_DTYPES.get(precision)
    if computes is not None and computes != dtype:
        fitting = ", ".join(name for name, computed in PRECISION_DTYPES.items() if computed == dtype)
        raise ValueError(
            f"--trainer.precision {precision} computes attention in {computes}, but the checkpoint {ckpt_path} "
            f"computes in {dtype} (its model.decoder.dtype, which a run from a checkpoint keeps): give a precision "
            f"that computes in {dtype} ({fitting})"
        )
