"""The command-line parser of every ``blindheads`` subcommand that is not LightningCLI's: help pages keep their
paragraphs and show defaults, and a mistake costs two lines (the error, then where the options are listed)."""

from __future__ import annotations

import argparse
import re
import sys

CLASS_PATH_ERRORS = (  # the option; a class path that failed, and why; or one that is not of the type expected
    r'Parser key "([^"]+)"',
    r"Problem with given class_path '([^']+)':\s*\n\s*(\S.*)",
    r"Expected a path but (\S+) either(?s:.*?)Import path does not correspond to (a subclass of \w+)",
)


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


def class_path_error(message: str) -> str | None:
    """jsonargparse's error for a class path that names no class of the type expected lists every type it tried (a
    dozen lines): the option, the class path and why, in one line; ``None`` for any other error."""
    key, problem, path = (re.search(pattern, message) for pattern in CLASS_PATH_ERRORS)
    if key and problem:
        named, wrong = problem[1], problem[2]
    elif key and path:
        named, wrong = path[1], f"not {path[2]}"
    else:
        return None
    return f"{key[1]}: class_path {named}: {wrong}"
