"""The ``blindheads`` command: one subcommand per job."""

from __future__ import annotations

import os
import signal
import sys

from blindheads.cli import blindness
from blindheads.cli.disk_full import DiskFull, no_space


def _lightning(subcommand: str):
    def run(argv: list[str]) -> None:
        from blindheads.cli.lightning import main as lightning_main  # Lightning loads only when needed

        lightning_main([subcommand, *argv])

    return run


def _probe(argv: list[str]) -> None:
    from blindheads.cli.probe import main as probe_main  # transformers loads only when needed

    probe_main(argv)


def _export(argv: list[str]) -> None:
    from blindheads.export.directory import main as export_main

    export_main(argv)


def _lm_eval(argv: list[str]) -> None:
    from blindheads.evaluation.lm_eval_adapter import main as lm_eval_main  # registers the ``blindheads`` model

    lm_eval_main(argv)


def _grid(argv: list[str]) -> None:
    from blindheads.experiments.grid import main as grid_main

    grid_main(argv)


def _conjecture(argv: list[str]) -> None:
    from blindheads.experiments.conjecture import main as conjecture_main

    conjecture_main(argv)


def _conjecture_arm(argv: list[str]) -> None:
    from blindheads.experiments.conjecture import arm_main

    arm_main(argv)


def _recheck(argv: list[str]) -> None:
    from blindheads.cli.recheck import main as recheck_main

    recheck_main(argv)


def _retrieval_heads(argv: list[str]) -> None:
    from blindheads.cli.retrieval_heads import main as retrieval_heads_main

    retrieval_heads_main(argv)


COMMANDS = {
    "blindness": blindness.main,
    "probe": _probe,
    "export": _export,
    "lm_eval": _lm_eval,
    "grid": _grid,
    "conjecture": _conjecture,
    "conjecture-arm": _conjecture_arm,
    "recheck": _recheck,
    "retrieval-heads": _retrieval_heads,
    **{name: _lightning(name) for name in ("fit", "validate", "test")},
}
SUMMARIES = {
    "blindness": "per-head blindness distance and underflow shares of a position stack",
    "fit": "train a decoder (LightningCLI; --config FILE ...)",
    "validate": "validate a checkpoint (--ckpt_path)",
    "test": "test a checkpoint: loss, retrieval, extrapolation, results.json",
    "probe": "measured vs predicted underflow of a published model",
    "export": "a Hugging Face directory from a checkpoint",
    "lm_eval": "lm-evaluation-harness on a checkpoint",
    "grid": "train and test every position setup at several seeds; one summary table and figures",
    "conjecture": "where does learning through a small attention weight stop? a dose-response curve, bare head and decoder",
    "conjecture-arm": "one run of blindheads conjecture (the driver starts it)",
    "recheck": "a tested run's recall re-evaluated: greedy decoding on fresh episodes vs the committed numbers",
    "retrieval-heads": "which heads of tested runs retrieve passkey and needle, and do they fail where those go blind",
}
USAGE = "usage: blindheads {" + ",".join(COMMANDS) + "} [options]   (blindheads COMMAND --help for its options)"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE + "\n\ncommands:\n" + "\n".join(f"  {name:<10} {SUMMARIES[name]}" for name in COMMANDS))
        return
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown command {argv[0]!r}; " if argv else ""
        sys.exit(f"{given}{USAGE}")
    try:
        COMMANDS[argv[0]](argv[1:])
        sys.stdout.flush()  # a reader gone away is found here, not in Python's clean-up at exit
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say, and nothing to flush to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except (ValueError, FileNotFoundError) as error:  # bad input: the message names the value and the choices
        sys.exit(f"blindheads {argv[0]}: error: {one_line(error)}")
    except Exception as error:  # a full disk, wherever it struck: one line, not a C++ traceback
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
