"""The progress page a plugin worker shares with its pool: which unit of a batch it is running.

A worker runs the units of one request that went to it one after the other and answers them in one
frame. So that the pool can still enforce each unit's own time budget, and tell which unit was running
when the worker died, the worker writes the index of the unit it starts and the time it started
(``CLOCK_MONOTONIC``, the same clock in every process) into a small shared memory page, a ``memfd`` the pool
created and passed to it. Writing it is a memory store, no system call; the pool reads it only when a
budget may have run out or the worker died.

The worker runs untrusted code, which may write anything there: the pool bounds what it reads (an index
within the batch, a start time between the batch's start and now), so a lying plugin can only blame another
unit of its own request, never delay a kill past the batch's own budget.

Standard library only (the plugin worker process imports it).
"""

from __future__ import annotations

import mmap
import os
import struct
import time

_LAYOUT = struct.Struct("=dq")  # start time of the unit, its index in the batch


class Progress:
    """One worker's progress page (either side)."""

    def __init__(self, fd: int) -> None:
        """The page of memfd ``fd`` (:meth:`create`), mapped; ``fd`` is closed (the mapping keeps the page)."""
        self._page = mmap.mmap(fd, _LAYOUT.size)
        os.close(fd)

    @staticmethod
    def create() -> int:
        """A new page for a worker (the pool's side): its descriptor, to pass to the worker, then to map."""
        fd = os.memfd_create("vmsched-progress", os.MFD_CLOEXEC)  # a worker gets it through pass_fds
        os.ftruncate(fd, _LAYOUT.size)
        return fd

    def mark(self, index: int) -> None:
        """The worker starts unit ``index`` now."""
        _LAYOUT.pack_into(self._page, 0, time.monotonic(), index)

    def read(self, count: int, since: float, now: float) -> tuple[int, float]:
        """(index, start) of the unit in progress, bounded to a batch of ``count`` started at ``since``."""
        started, index = _LAYOUT.unpack_from(self._page, 0)
        index = min(max(int(index), 0), count - 1)
        # not written for this batch yet (an earlier batch's mark is older than ``since``), or nonsense: its first unit
        if not since <= started <= now:
            return 0, since
        return index, started

    def close(self) -> None:
        self._page.close()
