"""A rank that rank 0 started on this machine dies with rank 0.

Rank 0 may go without a word (SIGKILL, the OOM killer, a crash in C): nothing then stops the ranks
it started, which would wait for it up to the rendezvous timeout (30 minutes) or, already joined,
print gloo's errors into whatever the terminal runs next. So a started rank watches its parent
from its first line, before torch is imported (that alone takes seconds):

- Linux: prctl(PR_SET_PDEATHSIG, SIGKILL), the kernel kills the rank the moment its parent goes.
  Only for a rank started from the parent's main thread: the signal follows the thread that
  started the child, and a worker thread that ends is no death of rank 0.
- everywhere: a daemon thread polls os.getppid() (an orphan is re-parented) and ends the rank.

No torch and nothing heavy here: this module is imported by the rank's first statement.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL = 0.2  # seconds between two looks at the parent


def watch_parent(parent: int, deathsig: bool) -> None:
    """End this process (quietly: nobody is left to read it) as soon as process `parent` is gone;
    deathsig: also ask the kernel for SIGKILL then (Linux)."""
    if deathsig and sys.platform.startswith("linux"):
        _kill_me_with_parent()
    if os.getppid() != parent:  # it went before the watch began
        os._exit(1)
    threading.Thread(target=_poll, args=(parent,), name="nexttok-tp-parent", daemon=True).start()


def orphaned(parent: int | None, wait: float = 0.0) -> bool:
    """Whether `parent` is no longer this process's parent, waiting up to `wait` seconds for it to
    show (a dying parent closes its sockets a moment before the child is re-parented)."""
    if parent is None:
        return False
    deadline = time.monotonic() + wait
    while os.getppid() == parent:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _kill_me_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the poll still ends the rank
        pass


def _poll(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL)
    os._exit(1)
