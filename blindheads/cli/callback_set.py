"""The callback set: each callback a config may run, under one name, with every init argument its own option
(``--callbacks.recall.samples 8``). A later config file or option changes one argument by name; a ``trainer.callbacks``
list is replaced whole by a later file, and its ``--trainer.callbacks.ARG`` edits the list's last entry whatever its
class. ``callbacks.use`` names the ones that run, in order; they run before any ``trainer.callbacks``. The settings
every config shares are the options' defaults, written once in ``configs/callbacks/base.yaml`` (package data:
``blindheads.packaged``)."""

from __future__ import annotations

import lightning as L
import yaml
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

from blindheads.callbacks.episode_recall import EpisodeRecall
from blindheads.callbacks.extrapolation import LengthExtrapolation
from blindheads.callbacks.gradient_blindness import GradientBlindness
from blindheads.callbacks.progress import ProgressLines
from blindheads.callbacks.retrieval import NeedleEval, PasskeyEval
from blindheads.callbacks.throughput import TokenThroughput
from blindheads.callbacks.underflow import UnderflowMonitor
from blindheads.callbacks.warm_start import WarmStart
from blindheads.packaged import CALLBACK_DEFAULTS, packaged

KINDS: dict[str, type[L.Callback]] = {
    "progress": ProgressLines,
    "checkpoint": ModelCheckpoint,
    "lr_monitor": LearningRateMonitor,
    "throughput": TokenThroughput,
    "underflow": UnderflowMonitor,
    "gradients": GradientBlindness,
    "passkey": PasskeyEval,
    "needle": NeedleEval,
    "extrapolation": LengthExtrapolation,
    "recall": EpisodeRecall,
    "warm_start": WarmStart,
}


def add_callback_set(parser) -> None:
    """``callbacks.NAME.ARG`` for every kind (instantiated only when used), defaults from ``CALLBACK_DEFAULTS``, and
    ``callbacks.use``."""
    for name, kind in KINDS.items():
        parser.add_class_arguments(kind, f"callbacks.{name}", instantiate=False)
    parser.add_argument(
        "--callbacks.use", type=list[str], default=[], help=f"the callbacks that run, in order: of {', '.join(KINDS)}"
    )
    base = yaml.safe_load(packaged(CALLBACK_DEFAULTS).read_text())["callbacks"]
    parser.set_defaults(
        {f"callbacks.{name}.{key}": value for name, args in base.items() for key, value in args.items()}
    )


def check_used(callbacks) -> None:
    """Every name in ``callbacks.use`` one of the set's, each once: a second ``recall`` would run the same evaluation
    twice, a second ``checkpoint`` two savers of one file."""
    unknown = [name for name in callbacks.use if name not in KINDS]
    if unknown:
        raise ValueError(f"--callbacks.use: unknown callback {unknown[0]!r}; valid: {', '.join(KINDS)}")
    twice = sorted({name for name in callbacks.use if callbacks.use.count(name) > 1})
    if twice:
        raise ValueError(
            f"--callbacks.use names {', '.join(twice)} more than once; each callback runs once: give it once"
        )


def used(callbacks) -> list[tuple[type[L.Callback], dict]]:
    """Each used callback's class and init arguments."""
    return [(KINDS[name], callbacks[name].as_dict()) for name in callbacks.use]


def instantiate(callbacks) -> list[L.Callback]:
    return [kind(**arguments) for kind, arguments in used(callbacks)]
