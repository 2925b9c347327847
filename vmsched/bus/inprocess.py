"""The in-process bus (``memory://``): the all-in-one's gateway, services and subscribers in one process.

One :class:`InProcessTransport` is created at start and handed to every party of the process. A request
needs none of a broker's work (routing through an exchange, a message object and its properties, a queue
per consumer, acknowledgements): the sender puts the envelope's bytes in the inbox of the worker that serves
the queue, with a callable for the reply; one of the worker's threads answers with the same
:class:`~vmsched.bus.replies.Replier` as on RabbitMQ and hands the reply's bytes to the callable (the
gateway's: ``loop.call_soon_threadsafe``). The bytes are those of the bus, so the contract (versions,
validation, deadlines, errors, metrics) is the same.

What a queue of the bus would do, an inbox does: a request put before its worker starts waits for it, and
the threads of every worker bound to a queue take its requests in turn. Nothing is acknowledged: in one
process there is nobody to redeliver to (a death ends the gateway too).

Events and facts go through topic exchanges: each subscriber has a mailbox bound with routing-key patterns
(AMQP's topic matching: ``*`` one word, ``#`` any number), kept to its queue's maximum length, and a thread
that hands each message to its callback.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any, Callable, Iterable

from kombu import Exchange

from vmsched import metrics
from vmsched.bus import BusTimeout, BusUnavailable, reply_body
from vmsched.bus.options import BusOptions
from vmsched.bus.interface import BusClient, Mark, Subscription, Transport, Worker, event_bytes, request_bytes, \
    settle
from vmsched.bus.replies import Handler
from vmsched.bus.topology import EVENTS_EXCHANGE

log = logging.getLogger("vmsched.bus")

#: How long a thread waits for work before it looks at its stop flag again, seconds.
WAIT = 1.0


@dataclass(frozen=True, slots=True)
class Request:
    queue: str
    body: bytes
    cid: str
    #: called with the reply's bytes (from the worker's thread); None: nobody waits for a reply
    reply: Callable[[bytes], None] | None


Inbox = SimpleQueue["Request | None"]


class Inboxes:
    """The request inboxes of one process, by queue name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inboxes: dict[str, Inbox] = {}
        self._bound: dict[int, tuple[frozenset[str], int]] = {}  # id(inbox) -> its queues, the workers bound

    def bind(self, queues: Iterable[str]) -> Inbox:
        """The inbox a worker takes the requests of ``queues`` from, with those that waited for it."""
        names = frozenset(queues)
        if not names:
            raise ValueError("a worker needs at least one queue")
        with self._lock:
            found = {id(inbox): inbox for name in names if (inbox := self._inboxes.get(name)) is not None}
            for key in found:
                if self._bound.get(key, (names, 0))[0] != names:  # threads would get requests they cannot handle
                    raise ValueError(f"queues {sorted(names)} overlap another worker's {sorted(self._bound[key][0])}")
            if len(found) == 1:
                inbox = next(iter(found.values()))
            else:  # none yet, or requests waiting in several: one inbox (each queue's requests in their order)
                inbox = SimpleQueue()
                for waiting in found.values():
                    while not waiting.empty():
                        inbox.put(waiting.get_nowait())
            for name in names:
                self._inboxes[name] = inbox
            self._bound[id(inbox)] = (names, self._bound.get(id(inbox), (names, 0))[1] + 1)
            return inbox

    def release(self, inbox: Inbox) -> None:
        """A worker of ``inbox`` stopped (its threads ended). With no worker left, what waits in it waits in
        its queue's own inbox again, for the next worker of that queue, whatever other queues it serves."""
        with self._lock:
            names, workers = self._bound.get(id(inbox), (frozenset(), 1))
            if workers > 1:
                self._bound[id(inbox)] = (names, workers - 1)
                return
            self._bound.pop(id(inbox), None)
            for name in names:
                if self._inboxes.get(name) is inbox:
                    del self._inboxes[name]
            while not inbox.empty():
                request = inbox.get_nowait()
                if request is not None:  # not a stop's wake-up
                    self._inboxes.setdefault(request.queue, SimpleQueue()).put(request)

    def put(self, request: Request) -> None:
        with self._lock:  # no worker yet: the request waits for the one that binds its queue
            inbox = self._inboxes.setdefault(request.queue, SimpleQueue())
        inbox.put(request)


def serve(inbox: Inbox, stop: threading.Event, answer: Callable[[Request], bytes | None]) -> None:
    """Answer the requests of ``inbox`` on this thread until ``stop`` is set (a None in the inbox wakes it)."""
    while not stop.is_set():
        try:
            request = inbox.get(timeout=WAIT)
        except Empty:
            continue
        if request is None:
            continue  # a stop's wake-up (maybe of another worker of the inbox: this one goes on)
        reply = answer(request)
        if reply is not None and request.reply is not None:
            request.reply(reply)


class InProcessWorker(Worker):
    """A service's consumer threads, taking the requests of its queues from their inbox."""

    def __init__(self, inboxes: Inboxes, service: str, routes: dict[str, Handler], consumers: int,
                 delivery_limit: int) -> None:
        super().__init__(service, routes, consumers, delivery_limit)
        self._inboxes = inboxes
        self._inbox: Inbox | None = None

    def start(self) -> None:
        self._stop.clear()
        inbox = self._inbox = self._inboxes.bind(self.routes)
        for i in range(self.consumers):
            self._spawn(partial(serve, inbox, self._stop, self._answer), f"{self.service}-consumer-{i}")
        metrics.BUS_UP.labels(self.service).set(1)
        self.ready.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Let the threads finish what they run (their replies still go out); what waits stays for the next."""
        self._stop.set()
        if self._inbox is not None:
            for _ in self._threads:
                self._inbox.put(None)  # wakes a thread waiting for a request
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()
        if self._inbox is not None:
            self._inboxes.release(self._inbox)
            self._inbox = None
        metrics.BUS_UP.labels(self.service).set(0)

    @property
    def connected(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def _answer(self, request: Request) -> bytes | None:
        """The reply; None if even the replier failed (logged): a consumer thread must survive anything."""
        try:
            return self.replier.handle(request.queue, request.body)
        except Exception:  # noqa: BLE001 - the replier answers every handler error
            log.exception("%s: request %s on %s not handled", self.service, request.cid, request.queue)
            return None


class InProcessClient(BusClient):
    """The gateway's client: a request goes to its worker's inbox, the reply comes back through the loop."""

    connected = False  # started and not closed

    def __init__(self, inboxes: Inboxes, service: str) -> None:
        super().__init__(service)
        self._inboxes = inboxes
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.connected = True
        metrics.BUS_UP.labels(self.service).set(1)

    async def close(self) -> None:
        self.connected = False
        metrics.BUS_UP.labels(self.service).set(0)
        await super().close()

    @property
    def last_error(self) -> str:
        return "" if self.connected else "not started" if self._loop is None else "closed"

    def send(self, cid: str, future: asyncio.Future[bytes], queue: str, op: str, body: dict[str, Any],
             deadline: float, mark: Mark) -> None:
        loop = self._loop
        if loop is None or not self.connected:
            raise BusUnavailable(f"message bus unavailable: {self.last_error}")
        self._inboxes.put(Request(queue, request_bytes(op, deadline, body, mark), cid,
                                  lambda raw: _settle_threadsafe(loop, future, raw)))


def _settle_threadsafe(loop: asyncio.AbstractEventLoop, future: asyncio.Future[bytes], raw: bytes) -> None:
    with suppress(RuntimeError):  # the loop is closed: nobody waits for it
        loop.call_soon_threadsafe(settle, future, raw)


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP's topic matching: words separated by dots, ``*`` one word, ``#`` zero or more."""
    return _words_match(pattern.split("."), key.split("."))


def _words_match(pattern: list[str], key: list[str]) -> bool:
    if not pattern:
        return not key
    if pattern[0] == "#":
        return any(_words_match(pattern[1:], key[i:]) for i in range(len(key) + 1))
    return bool(key) and pattern[0] in ("*", key[0]) and _words_match(pattern[1:], key[1:])


class Mailbox:
    """A subscriber's queue: the newest ``max_length`` messages (body, routing key) at most."""

    def __init__(self, max_length: int) -> None:
        self._messages: deque[tuple[bytes, str]] = deque(maxlen=max_length)
        self._ready = threading.Condition()

    def put(self, body: bytes, key: str) -> None:
        with self._ready:
            self._messages.append((body, key))
            self._ready.notify()

    def take(self, timeout: float) -> list[tuple[bytes, str]]:
        """Everything waiting; waits up to ``timeout`` seconds for a first message."""
        with self._ready:
            if not self._messages:
                self._ready.wait(timeout)
            taken = list(self._messages)
            self._messages.clear()
            return taken

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()


class Exchanges:
    """The process's topic exchanges: a message goes to every mailbox bound with a matching pattern."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bindings: list[tuple[str, tuple[str, ...], Mailbox]] = []

    def bind(self, exchange: Exchange, keys: tuple[str, ...], mailbox: Mailbox) -> None:
        with self._lock:
            self._bindings.append((exchange.name, keys, mailbox))

    def unbind(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._bindings = [binding for binding in self._bindings if binding[2] is not mailbox]

    def publish(self, exchange: Exchange, key: str, body: bytes) -> None:
        with self._lock:
            bindings = list(self._bindings)
        for name, patterns, mailbox in bindings:
            if name == exchange.name and any(topic_matches(pattern, key) for pattern in patterns):
                mailbox.put(body, key)


class InProcessSubscription(Subscription):
    """A subscriber's mailbox and the thread that hands its messages over."""

    transport: InProcessTransport

    @cached_property
    def _mailbox(self) -> Mailbox:
        return Mailbox(self.topic.max_length)

    def start(self) -> None:
        self.transport.exchanges.bind(self.topic.exchange, self.topic.keys, self._mailbox)
        super().start()

    def interrupt(self) -> None:
        self.transport.exchanges.unbind(self._mailbox)
        self._mailbox.wake()

    def serve(self) -> None:
        self.ready.set()
        if self.on_subscribed is not None:
            self.guarded(self.on_subscribed, self.transport.exchanges.publish)
        while not self.stopping.is_set():
            batch = self._mailbox.take(WAIT)
            if batch and self.linger > 0 and not self.stopping.wait(self.linger):
                batch += self._mailbox.take(0)
            for body, key in batch:
                self.guarded(self.on_message, body, key)
            self.ticked()


class InProcessEvents:
    """Events of one service: published to the process's subscribers at once."""

    def __init__(self, exchanges: Exchanges, service: str) -> None:
        self.service = service
        self._exchanges = exchanges

    def publish(self, routing_key: str, body: dict[str, Any]) -> bool:
        self._exchanges.publish(EVENTS_EXCHANGE, routing_key, event_bytes(self.service, body))
        return True

    def close(self) -> None:
        pass


class InProcessTransport(Transport):
    """The bus of one process: request inboxes and topic exchanges, shared by every party it is handed to."""

    spans_processes = False
    subscription = InProcessSubscription

    def __init__(self, options: BusOptions | None = None) -> None:
        self.options = options or BusOptions(url="memory://")
        self.inboxes = Inboxes()
        self.exchanges = Exchanges()

    def worker(self, service: str, routes: dict[str, Handler], *, consumers: int = 1, prefetch: int = 2,
               journal_dir: Path | None = None) -> InProcessWorker:
        return InProcessWorker(self.inboxes, service, routes, consumers, self.options.delivery_limit)

    def client(self, service: str = "gateway", declare: tuple[str, ...] = ()) -> InProcessClient:
        return InProcessClient(self.inboxes, service)

    def call(self, queue: str, op: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        replies: SimpleQueue[bytes] = SimpleQueue()
        self.inboxes.put(Request(queue, request_bytes(op, time.time() + timeout, body), "call", replies.put))
        try:
            return reply_body(replies.get(timeout=timeout), queue)
        except Empty:
            raise BusTimeout(f"no reply from {queue} within {timeout:g} s (is the service running?)") from None

    def events(self, service: str, *, confirm: bool = False) -> InProcessEvents:
        return InProcessEvents(self.exchanges, service)  # delivered at once: nothing to confirm
