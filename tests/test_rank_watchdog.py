"""A DDP rank whose launcher (rank 0) dies stops within seconds and says why, whichever way it stops."""

import subprocess
import sys
import textwrap
import time

import pytest

MESSAGE = "local rank 1 stops: the process that launched it"

# The launcher starts the rank, waits until its watchdog runs, then dies; the rank then does ``after``.
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys
    rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, "LOCAL_RANK": "1"},
                            stdout=subprocess.PIPE)
    rank.stdout.readline()
    os._exit(0)
    """
)
RANK = textwrap.dedent(
    """
    import io, os, sys, time
    from blindheads.runs import watchdog as rank_watchdog
    rank_watchdog.POLL_SECONDS = {poll}
    launcher = os.getppid()
    rank_watchdog.watch_launcher()
    print("watching", flush=True)
    {after}
    """
)


def orphaned_rank_stderr(poll: float, after: str) -> tuple[str, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, RANK.format(poll=poll, after=after)],
        stderr=subprocess.PIPE,  # the rank shares it: run returns when the rank has exited too
        text=True,
        timeout=120,
    )
    return done.stderr, time.monotonic() - start


def test_an_orphaned_rank_says_so_even_while_its_stderr_is_swapped():
    """torch's distributed excepthook swaps sys.stderr for a buffer while formatting a traceback."""
    stderr, seconds = orphaned_rank_stderr(0.1, "sys.stderr = io.StringIO()\ntime.sleep(300)")
    assert stderr.count(MESSAGE) == 1, stderr
    assert seconds < 60  # the watchdog stopped it, long before its sleep would end (two interpreters start first)


@pytest.mark.parametrize("exit_with", ["raise RuntimeError('Connection closed by peer')", "sys.exit(3)"])
def test_a_rank_that_exits_on_its_own_after_the_launcher_died_says_so_once(exit_with):
    """A collective often fails before the watchdog's poll: the rank then exits on that error, with the line."""
    wait = "while os.getppid() == launcher: time.sleep(0.01)"
    stderr, _ = orphaned_rank_stderr(60, f"{wait}\n{exit_with}")
    assert stderr.count(MESSAGE) == 1, stderr
