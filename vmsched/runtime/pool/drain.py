"""Draining what plugin workers write to their fd 1 and 2 (pool side).

A worker's fd 1 and 2 are one pipe to its pool, never the service's own log:
a plugin that calls ``os.write(1, ...)`` or a C library that prints lands
here. One thread per pool reads every worker's pipe; the last ``tail`` bytes
of each are kept (shown, escaped, when the worker dies) and the rest is
dropped, and what was written and what was dropped are counted in
``vmsched_plugin_raw_output_bytes_total``.
"""

from __future__ import annotations

import os
import selectors
import threading
from contextlib import suppress

from vmsched.metrics import PLUGIN_RAW_OUTPUT

TAIL = 4096


class OutputDrain:
    def __init__(self, pool: str) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._tails: dict[int, bytearray] = {}
        self._wake = os.eventfd(0, os.EFD_CLOEXEC)
        self._selector.register(self._wake, selectors.EVENT_READ, None)
        self._written = PLUGIN_RAW_OUTPUT.labels(pool=pool, fate="written")
        self._dropped = PLUGIN_RAW_OUTPUT.labels(pool=pool, fate="dropped")
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{pool}-drain", daemon=True)
        self._thread.start()

    def add(self, fd: int) -> None:
        """Drain ``fd`` (the pool's read end of a worker's output pipe) until EOF."""
        with self._lock:
            self._tails[fd] = bytearray()
            self._selector.register(fd, selectors.EVENT_READ, fd)
        os.eventfd_write(self._wake, 1)

    def tail(self, fd: int) -> str:
        """What the worker wrote last, escaped, for a log line."""
        with self._lock:
            data = bytes(self._tails.get(fd, b""))
        return data.decode("utf-8", "backslashreplace").encode("unicode_escape").decode("ascii")[-2000:]

    def close(self) -> None:
        self._closed = True
        os.eventfd_write(self._wake, 1)

    def _run(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select():
                if key.data is None:
                    os.eventfd_read(self._wake)
                    continue
                self._read(key.data)
        self._selector.close()
        os.close(self._wake)

    def _read(self, fd: int) -> None:
        with self._lock:
            buf = self._tails.get(fd)
            if buf is None:
                return  # forgotten (and maybe closed) since select() returned
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._selector.unregister(fd)
                return  # the tail stays until forget()
            buf += chunk
            self._written.inc(len(chunk))
            extra = len(buf) - TAIL
            if extra > 0:
                del buf[:extra]
                self._dropped.inc(extra)

    def forget(self, fd: int) -> None:
        """Stop draining ``fd`` (the caller closes it) and drop its tail."""
        with self._lock:
            if self._tails.pop(fd, None) is None:
                return
            with suppress(KeyError, ValueError):
                self._selector.unregister(fd)
