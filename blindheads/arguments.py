"""The command-line parser of every ``blindheads`` subcommand that is not LightningCLI's: help pages keep their
paragraphs and show defaults, and a mistake costs two lines (the error, then where the options are listed)."""

from __future__ import annotations

import argparse
import sys


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written (its lists and paragraphs), each option with its default where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, prog: str, description: str | None = None, **kwargs) -> None:
        super().__init__(prog=prog, description=description, formatter_class=HelpFormatter, **kwargs)

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message}\nsee: {self.prog} --help\n")
        sys.exit(2)
