"""The embedded bus: kombu's in-memory transport, woken by events, not polls.

kombu's ``memory://`` transport polls its queues every ``polling_interval``,
which turns straight into request latency. This subclass keeps kombu's queues
and semantics but signals every put: threads blocked in ``drain_events`` wait
on a condition, and an asyncio loop can watch a pipe registered for a queue.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import defaultdict
from queue import Empty
from time import monotonic

from kombu.transport import memory


class _Signal:
    """A generation counter behind a condition, plus per-queue wake-up pipes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0
        self._fds: dict[str, set[int]] = defaultdict(set)

    def notify(self, queue: str) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()
            fds = tuple(self._fds.get(queue, ()))
        for fd in fds:
            try:
                os.write(fd, b"\0")
            except (BlockingIOError, OSError):
                pass  # pipe full (a wake-up is already pending) or closed

    def wait(self, generation: int, timeout: float | None) -> None:
        with self._cond:
            if self.generation == generation:
                self._cond.wait(timeout)

    def watch(self, queue: str, fd: int) -> None:
        with self._cond:
            self._fds[queue].add(fd)

    def unwatch(self, queue: str, fd: int) -> None:
        with self._cond:
            self._fds[queue].discard(fd)


SIGNAL = _Signal()


class Channel(memory.Channel):
    def _put(self, queue, message, **kwargs):  # type: ignore[no-untyped-def]
        super()._put(queue, message, **kwargs)
        SIGNAL.notify(queue)

    def _put_fanout(self, exchange, message, routing_key=None, **kwargs):  # type: ignore[no-untyped-def]
        for queue in self._lookup(exchange, routing_key):
            self._put(queue, message)


class Transport(memory.Transport):
    Channel = Channel
    driver_name = "memory-evented"

    def drain_events(self, connection, timeout=None):  # type: ignore[no-untyped-def]
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            generation = SIGNAL.generation
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                remaining = None if deadline is None else deadline - monotonic()
                if remaining is not None and remaining <= 0:
                    raise socket.timeout() from None
                SIGNAL.wait(generation, remaining)


class QueueWatch:
    """A readable fd that becomes ready when a message is put on ``queue``."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.fd, self._wfd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._wfd, False)
        SIGNAL.watch(queue, self._wfd)

    def clear(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        SIGNAL.unwatch(self.queue, self._wfd)
        os.close(self.fd)
        os.close(self._wfd)
