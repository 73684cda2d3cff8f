"""The ``blindheads`` command: one subcommand per job, each run by a function the table ``COMMANDS`` names as
``module:function``. Every command's entry point (its options and ``main``) is a module of this package; the code it
runs lives in its own part (``blindheads.experiments``, ``blindheads.export``, ...). The table is read, and a
command's module imported, only when that command runs: this module imports the standard library alone, so
``blindheads --help`` answers at once and each command loads only what it uses."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable
from typing import NamedTuple


class Command(NamedTuple):
    """A subcommand: the function that runs it (``module:function``, given the arguments after its name), the line
    ``blindheads --help`` shows, and whether it is internal (started by another command, left out of ``--help``)."""

    target: str
    summary: str
    internal: bool = False

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def function(self) -> Callable[[list[str]], object]:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


COMMANDS = {
    "blindness": Command(
        "blindheads.cli.blindness:main", "per-head blindness distance and underflow shares of a position stack"
    ),
    "fit": Command("blindheads.cli.lightning:fit", "train a decoder (LightningCLI; --config FILE ...)"),
    "validate": Command("blindheads.cli.lightning:validate", "validate a checkpoint (--ckpt_path)"),
    "test": Command("blindheads.cli.lightning:test", "test a checkpoint: loss, retrieval, extrapolation, results.json"),
    "probe": Command("blindheads.cli.probe:main", "measured vs predicted underflow of a published model"),
    "export": Command("blindheads.cli.export:main", "a Hugging Face directory from a checkpoint"),
    "lm_eval": Command("blindheads.cli.lm_eval:main", "lm-evaluation-harness on a checkpoint"),
    "grid": Command(
        "blindheads.cli.grid:main",
        "train and test every position setup at several seeds; one summary table and figures",
    ),
    "conjecture": Command(
        "blindheads.cli.conjecture:main",
        "where does learning through a small attention weight stop? a dose-response curve, bare head and decoder",
    ),
    "conjecture-arm": Command(
        "blindheads.cli.conjecture:arm_main", "one run of blindheads conjecture (the driver starts it)", internal=True
    ),
    "recheck": Command(
        "blindheads.cli.recheck:main",
        "a tested run's recall re-evaluated: greedy decoding on fresh episodes vs the committed numbers",
    ),
    "retrieval-heads": Command(
        "blindheads.cli.retrieval_heads:main",
        "which heads of tested runs retrieve passkey and needle, and do they fail where those go blind",
    ),
}
LISTED = [name for name, command in COMMANDS.items() if not command.internal]
USAGE = "usage: blindheads {" + ",".join(LISTED) + "} [options]   (blindheads COMMAND --help for its options)"


def help_text() -> str:
    """The usage line, then each listed command beside its summary, in one column."""
    width = max(map(len, LISTED))
    return USAGE + "\n\ncommands:\n" + "\n".join(f"  {name:<{width}}  {COMMANDS[name].summary}" for name in LISTED)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        given = f"unknown command {argv[0]!r}; " if argv else ""
        sys.exit(f"{given}{USAGE}")
    try:
        if argv[0] in ("-h", "--help"):
            print(help_text())
        else:
            COMMANDS[argv[0]].function()(argv[1:])
        sys.stdout.flush()  # a reader gone away is found here, not in Python's clean-up at exit
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say, and nothing to flush to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except (ValueError, FileNotFoundError) as error:  # bad input: the message names the value and the choices
        sys.exit(f"blindheads {argv[0]}: error: {one_line(error)}")
    except Exception as error:  # a full disk, wherever it struck: one line, not a C++ traceback
        from blindheads.disk import DiskFull, no_space  # the standard library only

        full = no_space(error)
        if full is None:
            raise
        if not isinstance(full, DiskFull):  # a fit resumes from its checkpoint; any other command runs again
            advice = "free some space, then resume with --ckpt_path last" if argv[0] == "fit" else None
            full = DiskFull(full.filename or ".", advice=advice)
        sys.exit(f"blindheads {argv[0]}: error: {full}")


def one_line(error: BaseException) -> str:
    """The error's own message: one raised in a DataLoader worker arrives wrapped in the worker's traceback."""
    text = str(error)
    if text.startswith("Call to compute_fn of link") and error.__cause__ is not None:  # jsonargparse's wrapper
        return one_line(error.__cause__)
    if "Original Traceback" in text:
        last = text.rstrip().splitlines()[-1]
        text = last.split(": ", 1)[1] if last.startswith(f"{type(error).__name__}: ") else last
    return text
