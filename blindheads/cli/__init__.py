"""The ``blindheads`` command: one subcommand per job."""

from __future__ import annotations

import sys

from blindheads.cli import blindness


def _lightning(subcommand: str):
    def run(argv: list[str]) -> None:
        from blindheads.training.cli import main as lightning_main  # Lightning loads only when needed

        lightning_main([subcommand, *argv])

    return run


def _probe(argv: list[str]) -> None:
    from blindheads.cli.probe import main as probe_main  # transformers loads only when needed

    probe_main(argv)


def _export(argv: list[str]) -> None:
    from blindheads.export.export import main as export_main

    export_main(argv)


def _lm_eval(argv: list[str]) -> None:
    from blindheads.export.lm_eval_adapter import main as lm_eval_main  # registers the ``blindheads`` model

    lm_eval_main(argv)


COMMANDS = {
    "blindness": blindness.main,
    "probe": _probe,
    "export": _export,
    "lm_eval": _lm_eval,
    **{name: _lightning(name) for name in ("fit", "validate", "test")},
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown command {argv[0]!r}; " if argv and argv[0] not in ("-h", "--help") else ""
        sys.exit(f"{given}usage: blindheads {{{','.join(COMMANDS)}}} [options]")
    try:
        COMMANDS[argv[0]](argv[1:])
    except (ValueError, FileNotFoundError) as error:  # bad input: the message names the value and the choices
        sys.exit(f"blindheads {argv[0]}: error: {error}")
