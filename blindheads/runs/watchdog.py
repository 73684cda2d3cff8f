"""Ranks that outlive rank 0 stop: Lightning's DDP launcher starts ranks 1..N-1 as children of rank 0, so a rank 0
killed by SIGKILL (or the OOM killer) leaves them blocked in a collective until its timeout (30 minutes for gloo).
A child rank watches its launcher instead and exits, with a message, within a second of it disappearing. Across
nodes, where no parent can be watched, the DDP strategy's collective timeout does the same (the multi-GPU configs
set it)."""

from __future__ import annotations

import atexit
import os
import threading
import time

POLL_SECONDS = 0.5


def watch_launcher() -> threading.Thread | None:
    """In a rank launched by another process (``LOCAL_RANK`` above 0), exit when that process is gone."""
    local_rank = os.environ.get("LOCAL_RANK", "0")
    if local_rank in ("", "0"):
        return None
    launcher = os.getppid()
    # A collective often notices first (gloo: "Connection closed by peer") and the rank exits on that exception:
    # the same line is then written on the way out.
    atexit.register(_say_if_orphaned, launcher, local_rank)
    thread = threading.Thread(target=_watch, args=(launcher, local_rank), name="blindheads-rank-watchdog", daemon=True)
    thread.start()
    return thread


def _watch(launcher: int, local_rank: str) -> None:
    while os.getppid() == launcher:
        time.sleep(POLL_SECONDS)
    _say_if_orphaned(launcher, local_rank)
    os._exit(1)


def _say_if_orphaned(launcher: int, local_rank: str) -> None:
    """Written to file descriptor 2 itself: torch's distributed excepthook swaps ``sys.stderr`` for a buffer while
    it formats a traceback, and a line printed there would vanish with ``os._exit``."""
    if os.getppid() != launcher:
        os.write(
            2,
            f"\nblindheads: local rank {local_rank} stops: the process that launched it (pid {launcher}, rank 0) "
            "exited; the run stopped at its last checkpoint\n".encode(),
        )
