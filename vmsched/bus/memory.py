"""The embedded bus: kombu's in-memory transport, woken by events, not polls.

kombu's ``memory://`` transport polls its queues every ``polling_interval``,
which turns straight into request latency. This subclass keeps kombu's queues
and semantics but signals every put: threads blocked in ``drain_events`` wait
on a condition, and an asyncio loop can watch a pipe registered for a queue.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections import defaultdict
from queue import Empty
from typing import Iterable
from time import monotonic

from kombu.transport import memory


class _Signal:
    """Wakes exactly the consumers of a queue when a message is put on it.

    A consumer registers an Event for the queues it drains (threads) or a
    pipe (an asyncio loop watching a file descriptor).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, set[threading.Event]] = defaultdict(set)
        self._fds: dict[str, set[int]] = defaultdict(set)

    def notify(self, queue: str) -> None:
        with self._lock:
            events = tuple(self._events.get(queue, ()))
            fds = tuple(self._fds.get(queue, ()))
        for event in events:
            event.set()
        for fd in fds:
            try:
                os.write(fd, b"\0")
            except OSError:
                pass  # pipe full (a wake-up is already pending) or closed

    def subscribe(self, queues: Iterable[str], event: threading.Event) -> None:
        with self._lock:
            for queue in queues:
                self._events[queue].add(event)

    def unsubscribe(self, queues: Iterable[str], event: threading.Event) -> None:
        with self._lock:
            for queue in queues:
                self._events[queue].discard(event)

    def watch(self, queue: str, fd: int) -> None:
        with self._lock:
            self._fds[queue].add(fd)

    def unwatch(self, queue: str, fd: int) -> None:
        with self._lock:
            self._fds[queue].discard(fd)


SIGNAL = _Signal()


_TAGS = itertools.count(1)


class Channel(memory.Channel):
    body_encoding = None  # bodies stay bytes in memory: no base64 round trip

    def _next_delivery_tag(self):  # type: ignore[no-untyped-def]
        # unique in the process, as kombu's uuid4 per delivery is, without its getrandom call, which releases the
        # GIL: in the all-in-one process each release can hand it to another thread (two per request)
        return next(_TAGS)

    def _put(self, queue, message, **kwargs):  # type: ignore[no-untyped-def]
        super()._put(queue, message, **kwargs)
        SIGNAL.notify(queue)

    def _put_fanout(self, exchange, message, routing_key=None, **kwargs):  # type: ignore[no-untyped-def]
        for queue in self._lookup(exchange, routing_key):
            self._put(queue, message)


class Transport(memory.Transport):
    Channel = Channel
    driver_name = "memory-evented"

    def __init__(self, client, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(client, **kwargs)
        self._wake = threading.Event()
        self._subscribed: frozenset[str] = frozenset()

    def drain_events(self, connection, timeout=None):  # type: ignore[no-untyped-def]
        self._follow(frozenset(self._callbacks))
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            self._wake.clear()  # cleared before looking: a put after the look still wakes us
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                remaining = None if deadline is None else deadline - monotonic()
                if remaining is not None and remaining <= 0:
                    raise socket.timeout() from None
                self._wake.wait(remaining)

    def _follow(self, queues: frozenset[str]) -> None:
        if queues != self._subscribed:
            SIGNAL.unsubscribe(self._subscribed - queues, self._wake)
            SIGNAL.subscribe(queues - self._subscribed, self._wake)
            self._subscribed = queues

    def close_connection(self, connection):  # type: ignore[no-untyped-def]
        SIGNAL.unsubscribe(self._subscribed, self._wake)
        self._subscribed = frozenset()
        super().close_connection(connection)


class QueueWatch:
    """A readable fd that becomes ready when a message is put on ``queue``."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.fd, self._wfd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._wfd, False)
        SIGNAL.watch(queue, self._wfd)

    def clear(self) -> None:
        # one read when it does not fill the buffer (each os.read releases the GIL): a put after it writes
        # another byte, so the loop wakes again for that message
        try:
            while len(os.read(self.fd, 4096)) == 4096:
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        SIGNAL.unwatch(self.queue, self._wfd)
        os.close(self.fd)
        os.close(self._wfd)
