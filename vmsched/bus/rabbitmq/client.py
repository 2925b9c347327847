"""The gateway's request client on RabbitMQ, owned by the gateway's event loop: no thread of its own.

The loop publishes each request itself (a write of a few kilobytes into the socket's buffer), reads replies
when the broker's socket is readable (``loop.add_reader``), and looks at confirms, heartbeats and deadlines from a
timer. Only opening a connection (TCP, TLS and AMQP handshakes, the reply queue) and closing one with the broker
run in the loop's executor, since they wait for the broker's answers. Replies are matched to requests by
correlation id and handed to the caller's future. So a frozen or unreachable broker does not hold the loop:
``/healthz`` answers, and every call is answered (a reply, or an error) by its deadline.

Every wait on the broker is bounded: a read waits at most :data:`READ_WAIT` for the rest of a frame that has
begun to arrive (a partial frame is kept for the next read), a write at most :data:`IO_TIMEOUT_FLOOR` or the
confirm timeout, whichever is longer (a write waits only when the socket's buffer is full, hundreds of requests
the broker has not read), the handshake ``connect_timeout``. A broker that stops answering while its TCP
connection stays open (a frozen node) is told from a slow one by the confirms: a confirm overdue with nothing at
all heard from the broker since that publish means the node is gone. A lost connection is dropped without a
closing exchange (kombu's ``collect``) and replaced at once, to another node of a cluster first, with a new reply
queue.

Scheduling requests have no side effects: those in flight go out again on the new connection, and so does one
whose confirm is refused or overdue (:data:`MAX_SENDS` copies at most), within the caller's deadline
(``vmsched_bus_resent_total``; a second reply is dropped: ``vmsched_bus_duplicate_replies_total``). A request to
an agent is never sent twice: it fails with :class:`BusUnavailable`. Requests made while reconnecting wait for
it; when no node answers, they fail at once with :class:`BusUnavailable` and reconnection goes on with bounded
backoff.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import OrderedDict
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer
from kombu.message import Message

from vmsched import metrics
from vmsched.bus import BusUnavailable
from vmsched.bus.rabbitmq.confirms import Confirms
from vmsched.bus.rabbitmq.connection import CONNECTION_ERRORS, backoff, drop, ensure_exchanges, note_lost, \
    open_connection, publish_json, read_messages, safe_release
from vmsched.bus.interface import BusClient, Mark, request_bytes, settle
from vmsched.bus.options import BusOptions, mask
from vmsched.bus.topology import AGENT_EXCHANGE, EXCHANGES, reply_queue, request_queue, route
from vmsched.logs import BROKER_TROUBLE, broker

log = logging.getLogger("vmsched.bus")

#: A request the broker keeps refusing or not confirming fails after this many sends (a node loss can take three:
#: the send to the dying node, the re-send at each reconnection while the cluster settles).
MAX_SENDS = 5
#: The least time the client's socket waits for one write of the broker, seconds.
IO_TIMEOUT_FLOOR = 1.0
#: The longest wait of a read for the rest of a frame that has begun to arrive, seconds.
READ_WAIT = 0.01
_TICK = 0.1  # how often confirms and deadlines are looked at while requests wait, seconds
_RESENT_MEMORY = 4096  # answered re-sent requests remembered, to tell a duplicate reply from a late one
#: The longest wait of :meth:`AsyncBusClient.start` for the first connection attempt, beyond its own timeouts.
_START_SLACK = 10.0


class Unguessable:
    """8 random bytes from the OS, as hex, per call; read ``batch`` calls' worth at a time.

    ``os.urandom`` releases the GIL around its system call, and in a busy process (the all-in-one's gateway
    and services share one) each release can hand the GIL to another thread. Not thread-safe: one per thread.
    """

    def __init__(self, batch: int = 512) -> None:
        self._size = 8 * batch
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        if self._at >= len(self._pool):
            self._pool, self._at = os.urandom(self._size), 0
        token = self._pool[self._at:self._at + 8].hex()
        self._at += 8
        return token


@dataclass
class Outgoing:
    """What the client keeps of a request until it is answered: enough to send it again."""

    queue: str
    exchange: Exchange
    key: str
    payload: bytes
    deadline: float  # time.time()
    resend: bool  # a scheduling request (no side effects) may be sent again
    sent: int = 0
    failed: int = 0  # publishes that broke the connection
    why: str = "reconnect"  # why it goes out again after the next reconnection


class AsyncBusClient(BusClient):
    """One process's request connection to RabbitMQ, on its event loop; it starts once.

    Every method runs on the loop that called :meth:`start`.
    """

    connected = False  # connected and subscribed
    last_error = "not started"  # then the last connection's error ("" while connected)

    def __init__(self, options: BusOptions, declare: tuple[str, ...] = (), service: str = "gateway") -> None:
        super().__init__(service)
        self.options = options
        self._declare = declare
        self._token = Unguessable()  # used on the event loop's thread only
        self.io_timeout = max(IO_TIMEOUT_FLOOR, options.confirm_timeout)
        self.recovering = False  # a lost connection is being replaced: requests wait instead of failing
        self.attempted = asyncio.Event()  # the first connection attempt is over (made or failed)
        self._disconnected = asyncio.Event()  # set when the connection is lost: connect again
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._conn: Connection | None = None
        self._fd = -1  # its socket's, read by the loop
        self._producer: Producer | None = None
        self.reply_queue = ""
        self._declared: set[str] = set()
        self._requests: dict[str, Outgoing] = {}  # correlation id -> what to (re)send, until answered or expired
        self._resent_answered: OrderedDict[str, None] = OrderedDict()
        self._confirms: Confirms[str] = Confirms(on_ack=lambda cids: None, on_nack=self._on_nack)  # a reply ends it
        self._nacked = False  # a nack asks for a new connection once the frames at hand are read
        self._heard = 0.0  # time.monotonic() the broker was last heard from
        self._beat = 0.0

    async def start(self) -> None:
        """Connect, and keep connected; wait for the first connection attempt (made or failed: :attr:`attempted`)."""
        self._loop = asyncio.get_running_loop()
        self.last_error = "not connected yet"
        self._tick()
        self._connecting = self._loop.create_task(self._keep_connected())
        bound = (self.options.connect_timeout + self.io_timeout) * len(self.options.urls) + _START_SLACK
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.attempted.wait(), bound)

    async def close(self) -> None:
        self._stopping = True
        self.recovering = False
        self.last_error = "not started"
        if self._timer is not None:
            self._timer.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
            with suppress(asyncio.CancelledError):
                await self._connecting
        conn = self._detach()
        if conn is not None and self._loop is not None:
            await self._loop.run_in_executor(None, safe_release, conn)  # its waits are bounded by the socket's timeout
        drop(conn)
        await super().close()  # fails the calls still waiting

    # --- requests -------------------------------------------------------------
    def request_id(self) -> str:
        # unguessable, so that no other user of the reply exchange can answer in an agent's place
        return f"{self._token()}-{next(self._ids)}"

    def send(self, cid: str, future: asyncio.Future[bytes], queue: str, op: str, body: dict[str, Any],
             deadline: float, mark: Mark) -> None:
        if not (self.connected or self.recovering):  # no node answers: it fails at once
            raise BusUnavailable(f"message bus unavailable: {self.last_error}")
        exchange, key = route(queue)
        request = self._requests[cid] = Outgoing(queue, exchange, key, request_bytes(op, deadline, body, mark),
                                                 deadline, resend=exchange is not AGENT_EXCHANGE)
        if self._conn is not None:  # else sent once reconnected
            self._send(cid, request)

    def _send(self, cid: str, request: Outgoing) -> None:
        """Publish ``request``; a broken connection is replaced and the request sent again from there."""
        assert self._producer is not None and self._conn is not None
        try:
            if request.queue not in self._declared and request.exchange is not AGENT_EXCHANGE:
                # scheduling queues wait for their service (the gateway's are declared on connecting); an agent
                # declares its own queue
                request_queue(request.queue, self.options.delivery_limit)(self._conn.default_channel).declare()
                self._declared.add(request.queue)
            publish_json(self._producer, request.payload, request.exchange, request.key, correlation_id=cid,
                         reply_to=self.reply_queue, expiration=max(0.001, request.deadline - time.time()))
        except CONNECTION_ERRORS as exc:
            request.failed += 1
            if request.failed >= MAX_SENDS:  # e.g. a queue refused
                self._fail(cid, BusUnavailable(f"message bus unavailable: {_describe(exc)}"))
            self._lost(exc)  # else not sent: goes out again once reconnected
            return
        request.sent += 1
        self._confirms.published(cid)

    def _send_waiting(self) -> None:
        """After a reconnection: send what waited for it, and again the scheduling requests sent before."""
        now = time.time()
        for cid, request in list(self._requests.items()):
            if self._conn is None:
                return  # lost again: the next reconnection sends them
            if cid not in self._requests or request.deadline <= now or (request.sent and not request.resend):
                continue
            if request.sent:
                metrics.BUS_RESENT.labels(self.service, request.why).inc()
                request.why = "reconnect"
            self._send(cid, request)

    def _readable(self) -> None:
        """The broker's socket has something: read the replies and confirms that have come."""
        conn = self._conn
        assert conn is not None
        self._heard = time.monotonic()
        try:
            read_messages(conn, conn.connection.sock, READ_WAIT)
        except CONNECTION_ERRORS as exc:  # also ConsumerCancelled: the reply queue was deleted (its node died)
            if self._conn is conn:
                self._lost(exc)
            return
        if self._nacked and self._conn is conn:
            self._nacked = False
            self._lost(BusUnavailable("the broker refused a request (publisher nack)"))

    def _tick(self) -> None:
        """Look at confirms, heartbeats and deadlines: every :data:`_TICK` while requests wait, else every second."""
        assert self._loop is not None
        if self._stopping:
            return
        self._timer = self._loop.call_later(_TICK if self._requests else 1.0, self._tick)
        conn = self._conn
        if conn is not None:
            try:
                self._check_confirms()
                if self._conn is conn and time.monotonic() >= self._beat:
                    self._beat = time.monotonic() + max(1.0, self.options.heartbeat / 3)
                    conn.heartbeat_check()
            except CONNECTION_ERRORS as exc:
                if self._conn is conn:
                    self._lost(exc)
        self._expire()

    def _check_confirms(self) -> None:
        """Confirms overdue: the broker went silent (the connection is replaced), or this request was not
        confirmed (a scheduling request is sent again, up to MAX_SENDS copies; else it fails)."""
        for cid, published in self._confirms.overdue(self.options.confirm_timeout):
            if self._heard < published:
                self._lost(BusUnavailable(f"the broker answered nothing for {self.options.confirm_timeout:g} s"))
                return
            self._confirm_overdue(cid)
            if self._conn is None:
                return

    def _confirm_overdue(self, cid: str) -> None:
        request = self._requests.get(cid)
        if request is None:
            return
        if not request.resend or request.sent >= MAX_SENDS or request.deadline <= time.time():
            self._fail(cid, BusUnavailable(f"no publisher confirm within {self.options.confirm_timeout:g} s"))
        elif self._conn is not None:  # else it goes out again once reconnected
            metrics.BUS_RESENT.labels(self.service, "confirm_timeout").inc()
            log.info("%s: request %s to %s sent again (no confirm)", self.service, cid, request.queue)
            self._send(cid, request)

    def _on_nack(self, cids: list[str]) -> None:
        """A quorum queue nacks while it elects a leader, and RabbitMQ (3.10) then nacks every later publish
        of that channel to it: the requests go out again on a new connection."""
        for cid in cids:
            request = self._requests.get(cid)
            if request is None:
                continue
            if request.resend and request.deadline > time.time() and request.sent < MAX_SENDS:
                request.why, self._nacked = "nack", True
            else:
                self._fail(cid, BusUnavailable("the broker refused the request (publisher nack)"))

    def _on_reply(self, message: Message) -> None:
        cid = message.properties.get("correlation_id")
        request = self._requests.pop(cid, None) if cid else None
        if request is None:
            if cid in self._resent_answered:
                metrics.BUS_DUPLICATE_REPLIES.labels(self.service).inc()
            return  # else the caller gave up already
        if request.sent > 1:
            self._remember(cid)
        body = message.body
        settle(self._pending.get(cid), body if isinstance(body, bytes) else str(body).encode())

    def _expire(self) -> None:
        """Forget the requests whose deadline passed (their callers gave up)."""
        wall = time.time()
        for cid, request in list(self._requests.items()):
            if request.deadline <= wall:
                del self._requests[cid]
                if request.sent > 1:
                    self._remember(cid)

    def _remember(self, cid: str) -> None:
        self._resent_answered[cid] = None
        while len(self._resent_answered) > _RESENT_MEMORY:
            self._resent_answered.popitem(last=False)

    def _fail(self, cid: str, error: BaseException) -> None:
        if self._requests.pop(cid, None) is not None:
            settle(self._pending.get(cid), error)

    def _fail_all(self, error: str, only_unrepeatable: bool = False) -> None:
        """Fail the requests waiting (``only_unrepeatable``: those to agents already sent, never sent twice)."""
        for cid, request in list(self._requests.items()):
            if not only_unrepeatable or (request.sent and not request.resend):
                self._fail(cid, BusUnavailable(error))

    # --- the connection ---------------------------------------------------------
    async def _keep_connected(self) -> None:
        """Connect, and after each loss connect again, with bounded backoff while no node answers."""
        assert self._loop is not None
        attempt = 0
        while not self._stopping:
            if self._conn is not None:
                await self._disconnected.wait()
                continue
            if self.attempted.is_set():
                await asyncio.sleep(backoff(attempt, self.options.reconnect_max_delay))
                attempt += 1
            try:
                if await self._connect():
                    attempt = 0
            except Exception:  # noqa: BLE001 - logged; the next attempt comes after the backoff
                log.exception("%s: connecting to the bus failed", self.service)

    async def _connect(self) -> bool:
        """Open a connection, create the exchanges (the gateway's user may: docs/deploy/broker-users.md) and
        subscribe, in the executor; False when no node answers (the requests waiting then fail)."""
        assert self._loop is not None
        first = not self.attempted.is_set()
        opening = self._loop.run_in_executor(None, self._open)
        try:
            conn = await asyncio.shield(opening)
        except asyncio.CancelledError:  # stopping: the connection being opened is thrown away once open
            opening.add_done_callback(lambda done: done.exception() or drop(done.result()))
            raise
        except CONNECTION_ERRORS as exc:
            self.last_error = _describe(exc)
            if self.recovering or first:  # no node answers: fail fast until one does
                held = BROKER_TROUBLE.allow(self.options.url)  # one line for all the threads of the process
                if held is not None:
                    log.warning("%s: no answer from the broker at %s: %s; scheduling requests fail until it "
                                "answers%s", self.service, broker(self.options.url), self.last_error, held)
                self.recovering = False
                self._fail_all(f"message bus unavailable: {self.last_error}")
            return False
        finally:
            self.attempted.set()
        self._conn = conn
        self._disconnected.clear()
        self._fd = conn.connection.sock.fileno()
        self._loop.add_reader(self._fd, self._readable)
        BROKER_TROUBLE.clear(self.options.url)
        self.connected, self.recovering, self.last_error = True, False, ""
        self._heard = time.monotonic()
        metrics.BUS_UP.labels(self.service).set(1)
        if not first:
            metrics.BUS_RECONNECTS.labels(self.service).inc()
            log.info("%s: reconnected to the bus at %s", self.service, broker(conn.as_uri()))
        self._send_waiting()
        return True

    def _open(self) -> Connection:
        """In the executor: a new connection, subscribed to a new reply queue, with the gateway's queues
        declared; the loop takes it over once it is ready."""
        conn = None
        try:
            conn = open_connection(self.options)
            conn.connection.sock.settimeout(self.io_timeout)  # every later wait on the broker is bounded
            ensure_exchanges(conn, EXCHANGES)
            channel = conn.default_channel
            # a new name each time: the old queue may outlive its connection on the broker for a moment
            self.reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"
            Consumer(channel, [reply_queue(self.reply_queue)], on_message=self._on_reply, no_ack=True).consume()
            self._declared = set()
            for name in self._declare:
                request_queue(name, self.options.delivery_limit)(channel).declare()
                self._declared.add(name)
            self._producer = Producer(channel, auto_declare=False)
            self._confirms.watch(channel)  # a refused or missing confirm sends the request again or fails it
            return conn
        except BaseException:
            note_lost(conn)
            drop(conn)
            raise

    def _detach(self) -> Connection | None:
        """Stop reading the connection and forget it; the caller closes it."""
        conn = self._conn
        self._conn = self._producer = None
        if self._fd >= 0 and self._loop is not None:
            self._loop.remove_reader(self._fd)  # before the socket is closed: its number may be reused
            self._fd = -1
        if self.connected:
            self.connected = False
            metrics.BUS_UP.labels(self.service).set(0)
        return conn

    def _lost(self, exc: BaseException) -> None:
        """The connection broke (or its broker went silent): drop it and connect again."""
        self.last_error = _describe(exc)
        held = BROKER_TROUBLE.allow(self.options.url)  # one line for all the threads of the process
        if held is not None:
            log.warning("%s: bus connection to %s lost (%s)%s", self.service, broker(self.options.url),
                        self.last_error, held)
        conn = self._detach()
        note_lost(conn)
        drop(conn)
        # scheduling requests wait for the next connection (an agent's request is never sent twice)
        self.recovering = not self._stopping
        self._fail_all(f"message bus connection lost: {self.last_error}", only_unrepeatable=self.recovering)
        self._disconnected.set()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {mask(str(exc))}" if str(exc) else type(exc).__name__

