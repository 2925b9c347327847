"""The transport seam: what the parties of a process need from the bus, whatever carries it.

A process chooses one :class:`Transport` at start, from the broker URL
(:func:`vmsched.bus.transport.open_transport`): ``memory://`` is the in-process bus
(:mod:`vmsched.bus.inprocess`), anything else RabbitMQ through kombu (:mod:`vmsched.bus.rabbitmq.broker`).
That one object is handed to every party of the process: the gateway's client, each service
worker, the subscriptions (host facts, snapshot requests, the gateways' decision questions) and the
event publishers. The bytes are the same on both: the request and reply envelopes of
:mod:`vmsched.messages`, the events' JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import json
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar, overload

from kombu import Exchange
from pydantic import BaseModel

from vmsched.bus import BusTimeout, BusUnavailable, parse_reply, reply_body
from vmsched.bus.options import BusOptions
from vmsched.bus.replies import Handler, Replier
from vmsched.bus.topology import PING
from vmsched.messages import Envelope, ReplyEnvelope, TypedReply

log = logging.getLogger("vmsched.bus")

M = TypeVar("M", bound=BaseModel)

#: A request's call ID and "record this call" (:class:`vmsched.messages.Envelope` ``call``, ``record``).
Mark = tuple[str, bool]
#: Called with a message's body and its routing key (on the subscription's own thread).
OnMessage = Callable[[bytes, str], object]
#: Publishes ``body`` on ``exchange`` with a routing key: what a subscription may send once it is subscribed.
Publish = Callable[[Exchange, str, bytes], None]


class Worker(ABC):
    """A service's consumer of its request queues: runs a handler per request and replies (the transport's
    subclass moves the requests and the replies)."""

    connected: bool

    def __init__(self, service: str, routes: dict[str, Handler], consumers: int, delivery_limit: int) -> None:
        if not routes:
            raise ValueError("a worker needs at least one queue and handler")
        self.service = service
        self.routes = dict(routes)
        self.consumers = consumers
        self.replier = Replier(service, self.routes, delivery_limit)
        self.ready = threading.Event()  # set once it takes requests
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self, timeout: float = 5.0) -> None: ...

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)


@dataclass(eq=False)
class Subscription:
    """A subscriber's own queue on a topic exchange, served by a thread of its own (each transport's
    subclass writes :meth:`serve`): it hands every message to ``on_message``, calls ``on_subscribed`` with a
    publisher once subscribed, waits ``linger`` seconds after a message to take what follows with it, and calls
    ``tick`` about every second. A failure of a callback is logged, never raised."""

    transport: Transport
    name: str
    topic: Topic
    on_message: OnMessage
    on_subscribed: Callable[[Publish], None] | None = None
    linger: float = 0.0
    tick: Callable[[], None] | None = None
    ready: threading.Event = field(default_factory=threading.Event, init=False)  # set once subscribed
    stopping: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _next_tick: float = field(default=0.0, init=False)

    def start(self) -> None:
        self.stopping.clear()
        self._thread = threading.Thread(target=self.serve, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.interrupt()
        if self._thread is not None:
            self._thread.join(timeout)

    def serve(self) -> None:
        """The thread: subscribe, then hand messages over until :attr:`stopping` is set."""
        raise NotImplementedError

    def interrupt(self) -> None:
        """Wake the thread from its wait (:meth:`stop`)."""

    def guarded(self, function: Callable[..., object], *args: Any) -> None:
        try:
            function(*args)
        except Exception:  # noqa: BLE001 - a bad message must not stop the subscription
            log.exception("%s: handling a message failed", self.name)

    def ticked(self) -> None:
        """Call ``tick`` if a second has passed since the last time."""
        if self.tick is not None and time.monotonic() >= self._next_tick:
            self.guarded(self.tick)
            self._next_tick = time.monotonic() + 1.0


class EventSink(Protocol):
    """Best-effort publisher of events on ``vmsched.events``: never raises; False when the event was dropped."""

    def publish(self, routing_key: str, body: dict[str, Any]) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Topic:
    """A subscriber's own queue: its name, the topic exchange it is bound to with ``keys``, how many messages
    it keeps at most (the oldest go first), and the exchanges it publishes to once subscribed (``also``)."""

    queue: str
    exchange: Exchange
    keys: tuple[str, ...]
    max_length: int
    also: tuple[Exchange, ...] = ()


class BusClient(ABC):
    """The gateway's request client, driven from its asyncio event loop.

    ``call``, ``ping`` and :meth:`roundtrip` (the reply's bytes to one request, or
    :class:`BusTimeout`/:class:`BusUnavailable`) are the same on every transport; a transport gives :meth:`send`.
    """

    def __init__(self, service: str) -> None:
        self.service = service
        self._ids = itertools.count()
        self._pending: dict[str, asyncio.Future[bytes]] = {}  # request ID -> the caller's future

    @abstractmethod
    async def start(self) -> None: ...

    async def close(self) -> None:
        """Fail the calls still waiting (a transport's own close stops it first)."""
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(BusUnavailable("gateway shutting down"))

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    @property
    @abstractmethod
    def last_error(self) -> str: ...

    def request_id(self) -> str:
        """A new request's ID (its correlation ID)."""
        return str(next(self._ids))

    def send(self, cid: str, future: asyncio.Future[bytes], queue: str, op: str, body: dict[str, Any],
             deadline: float, mark: Mark) -> None:
        """Send request ``cid`` (or raise :class:`BusUnavailable`); its reply's bytes or its error settle ``future``
        (:func:`settle`)."""
        raise NotImplementedError

    async def roundtrip(self, queue: str, op: str, body: dict[str, Any], timeout: float, mark: Mark = ("", False),
                        ) -> bytes:
        """Send one request and return its reply's bytes, within ``timeout`` seconds
        (``mark``: :func:`request_bytes`)."""
        cid = self.request_id()
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[cid] = future
        try:
            self.send(cid, future, queue, op, body, time.time() + timeout, mark)
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise BusTimeout(f"no {op} reply from {queue} within {timeout:g} s") from None
        finally:
            self._pending.pop(cid, None)

    @overload
    async def call(self, queue: str, op: str, body: dict[str, Any], timeout: float) -> dict[str, Any]: ...

    @overload
    async def call(self, queue: str, op: str, body: dict[str, Any], timeout: float, model: type[M],
                   mark: Mark = ...) -> M: ...

    async def call(
        self, queue: str, op: str, body: dict[str, Any], timeout: float, model: type[M] | None = None,
        mark: Mark = ("", False),
    ) -> dict[str, Any] | M:
        """Send a request and wait for its reply body, at most ``timeout`` seconds.

        With ``model`` the reply is parsed in one pass into that type. An error
        reply raises :class:`RequestError` carrying the reply's ``code``.
        """
        reply_type = TypedReply[model] if model else ReplyEnvelope  # type: ignore[valid-type]
        return reply_body(await self.roundtrip(queue, op, body, timeout, mark), queue, reply_type)

    async def ping(self, queue: str, timeout: float = 1.0) -> bool:
        try:
            return parse_reply(await self.roundtrip(queue, PING, {}, timeout), queue).ok
        except (BusTimeout, BusUnavailable):
            return False


def settle(future: asyncio.Future[bytes] | None, outcome: bytes | BaseException) -> None:
    """Hand a request's reply (or its error) to its caller's ``future``, unless the caller gave up already."""
    if future is None or future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def request_bytes(op: str, deadline: float, body: dict[str, Any], mark: Mark = ("", False)) -> bytes:
    """A request envelope as it goes on the bus; ``mark``: the call's ID and whether its gateway records it."""
    return Envelope(op=op, deadline=deadline, body=body, call=mark[0], record=mark[1]).model_dump_json().encode()


class Transport(ABC):
    """How the parties of this process reach the others: one object per process, chosen at start."""

    options: BusOptions
    #: Whether other processes use this bus (other replicas, other releases): RabbitMQ. The in-process bus
    #: serves one process, whose gateway and services are of one release.
    spans_processes: bool
    #: The class of this transport's subscriptions.
    subscription: type[Subscription]

    @abstractmethod
    def worker(self, service: str, routes: dict[str, Handler], *, consumers: int = 1, prefetch: int = 2,
               journal_dir: Path | None = None) -> Worker:
        """A consumer of ``routes`` (queue -> handler) for ``service``; not started."""

    @abstractmethod
    def client(self, service: str = "gateway", declare: tuple[str, ...] = ()) -> BusClient:
        """The gateway's request client; ``declare``: request queues it creates (they wait for their service)."""

    @abstractmethod
    def call(self, queue: str, op: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """One blocking request (the CLI and tools): the reply body, or the bus errors."""

    @abstractmethod
    def events(self, service: str, *, confirm: bool = False) -> EventSink:
        """A publisher of ``service``'s events; ``confirm``: an event counts as sent once the broker confirmed
        it (sent again on a new connection, else reported dropped)."""

    def subscribe(self, name: str, topic: Topic, on_message: OnMessage, *,
                  on_subscribed: Callable[[Publish], None] | None = None, linger: float = 0.0,
                  tick: Callable[[], None] | None = None) -> Subscription:
        """A subscription of ``topic``, not started: ``on_message`` gets every message on its thread,
        ``on_subscribed`` runs after each (re)subscription, ``tick`` about every second. ``linger``: seconds
        to wait after a message has woken the thread for the others arriving meanwhile (one wake-up a batch)."""
        return self.subscription(self, name, topic, on_message, on_subscribed, linger, tick)


def event_bytes(service: str, body: dict[str, Any]) -> bytes:
    """An event as it goes on the bus: who sent it, when, and its body."""
    return json.dumps({"service": service, "time": time.time(), **body}).encode()
