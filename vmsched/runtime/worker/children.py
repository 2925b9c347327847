"""Killing and reaping whatever a plugin started, after each call (worker side).

The worker is a child subreaper (PR_SET_CHILD_SUBREAPER): when a plugin's
child dies, its own children (a ``setsid`` daemon, a double fork) are
re-parented to the worker instead of init. So killing the worker's children
until none is left reaches every descendant, in any session or group.
Standard library only.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress

_ROUNDS = 1000  # bounds a plugin that forks faster than we kill (RLIMIT_NPROC bounds it too)


def of(pid: int | str = "self") -> list[int]:
    """The live children of process ``pid`` (of each of its threads; empty if it is gone)."""
    pids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return pids


def kill_all() -> None:
    """SIGKILL and reap every descendant."""
    try:
        os.waitpid(-1, os.WNOHANG)  # children exist (one may have just been reaped too)
    except ChildProcessError:
        return  # the usual case: the plugin left nothing behind
    for _ in range(_ROUNDS):
        pids = of()
        if not pids:
            break
        for pid in pids:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with suppress(ChildProcessError):
                os.waitpid(pid, 0)  # its orphans are ours once it is gone
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # anything that exited on its own in between
            pass
