"""The project's one signal mechanism: which signals stop a command, how a handler is installed for a while and the
previous one restored, how DataLoader workers leave them to the main process, and how a stopped command exits (one
line, 128 + the signal's number). A fit routes them to a save at the step's end (``runs.interrupts``); a driver of
many runs forwards them to its jobs (``experiments.driver.jobs.Driver``). The standard library only."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, a scheduler's pre-emption, a closed terminal


class Interrupted(BaseException):
    """A signal stopped the command (not an ``Exception``: nothing may catch it and carry on). ``line`` is what the
    command says on its way out."""

    def __init__(self, signum: int, line: str) -> None:
        super().__init__(line)
        self.signum, self.line = signum, line


@contextmanager
def handling(signums: tuple[int, ...], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for ``signums`` while the block runs; the previous handlers come back after it."""
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


def ignore_stops() -> None:
    """In a DataLoader worker: the stop signals are the main process's, which shuts the workers down."""
    for signum in STOPS:
        signal.signal(signum, signal.SIG_IGN)


def exit_after(stop: BaseException) -> NoReturn:
    """Where the command stopped on a signal: print its line (``Interrupted``) or say no step was saved, and exit
    with 128 + the signal's number (a ``KeyboardInterrupt`` is SIGINT; Lightning's own stop, SIGTERM)."""
    signum = (
        stop.signum
        if isinstance(stop, Interrupted)
        else signal.SIGINT
        if isinstance(stop, KeyboardInterrupt)
        else signal.SIGTERM
    )
    line = (
        stop.line
        if isinstance(stop, Interrupted)
        else f"blindheads: stopped by {signal.Signals(signum).name}: no step to save"
    )
    print(line, file=sys.stderr, flush=True)
    sys.exit(128 + int(signum))
