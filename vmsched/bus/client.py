"""The gateway's request client on RabbitMQ: kombu driven from the asyncio event loop.

Everything happens on the loop thread, so the connection is never shared
between threads and no message is handed between threads: the loop watches
the broker socket and drains it without blocking; publishing is a socket
write plus a publisher confirm awaited asynchronously (:mod:`vmsched.bus.confirms`).
Replies are matched to callers by correlation id.

When the connection breaks (its node died, a channel error, or the broker
cancelled the consumer of the exclusive reply queue: the queue was deleted),
a task reconnects at once, to another node of a cluster first, with a new
reply queue. Scheduling requests have no side effects: those in flight go out
again on the new connection, and so does one whose confirm is refused or
overdue (five copies at most), within the caller's deadline (``vmsched_bus_resent_total``; a second
reply is dropped: ``vmsched_bus_duplicate_replies_total``). A request to an
agent is never sent twice: it fails with :class:`BusUnavailable`. Calls made
while reconnecting wait for it; when no node answers, calls fail at once with
:class:`BusUnavailable` and reconnection goes on with bounded backoff.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
import uuid
from collections import OrderedDict
from typing import Any

from kombu import Connection, Consumer, Producer
from kombu.message import Message

from vmsched import metrics
from vmsched.bus import BusUnavailable
from vmsched.bus.confirms import Confirms
from vmsched.bus.connection import CONNECTION_ERRORS, BusOptions, backoff, ensure_exchanges, note_lost, \
    open_connection, safe_release
from vmsched.bus.interface import BusClient, request_bytes, wait_reply
from vmsched.bus.outgoing import Outgoing
from vmsched.bus.sockets import buffered, nonblocking
from vmsched.bus.tokens import Unguessable
from vmsched.bus.topology import AGENT_EXCHANGE, EXCHANGES, REPLY_EXCHANGE, REPLY_VIA, reply_queue, request_queue, \
    route
from vmsched.bus.urls import mask

log = logging.getLogger("vmsched.bus")

_REPLY_HEADERS = {REPLY_VIA: REPLY_EXCHANGE.name}


_RESENT_MEMORY = 4096  # answered re-sent requests remembered, to tell a duplicate reply from a late one
_MAX_SENDS = 5  # a request the broker keeps refusing or not confirming fails after this many sends (a node loss
# can take three: the send to the dying node, the re-send at each reconnection while the cluster settles)


class AsyncBusClient(BusClient):
    def __init__(self, options: BusOptions, declare: tuple[str, ...] = (), service: str = "gateway") -> None:
        self.options = options
        self.service = service
        self._declare = declare
        self._reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"
        self._ids = itertools.count()
        self._token = Unguessable()  # used on the event loop's thread only
        self._pending: dict[str, asyncio.Future[bytes]] = {}  # correlation id -> the caller's future
        self._requests: dict[str, Outgoing] = {}  # correlation id -> what to (re)send
        self._resent_answered: OrderedDict[str, None] = OrderedDict()
        self._conn: Connection | None = None
        self._publisher: Producer | None = None
        self._consumer: Consumer | None = None
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._declared: set[str] = set()
        self._confirms = Confirms(options.confirm_timeout, self._on_nack, self._confirm_overdue)
        self._recovering = False  # a lost connection is being replaced: calls wait instead of failing
        self._last_error = "not connected yet"
        self._closed = False

    # --- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._attach(await self._loop.run_in_executor(None, self._connect))
        except CONNECTION_ERRORS as exc:
            self._lost(exc, recovering=False)
        self._heartbeat_task = self._loop.create_task(self._heartbeats())

    async def close(self) -> None:
        self._closed = True
        for task in (self._reconnect_task, self._heartbeat_task):
            if task is not None:
                task.cancel()
        self._detach()
        self._fail_all(BusUnavailable("gateway shutting down"))

    @property
    def connected(self) -> bool:
        return self._conn is not None

    @property
    def last_error(self) -> str:
        return self._last_error

    # --- calls ---------------------------------------------------------------
    async def roundtrip(self, queue: str, op: str, body: dict[str, Any], timeout: float,
                        accepts: tuple[str, ...] = ()) -> bytes:
        if self._conn is None and not self._recovering:
            raise BusUnavailable(f"message bus unavailable: {self.last_error}")
        assert self._loop is not None
        # unguessable, so that no other user of the reply exchange can answer in an agent's place
        cid = f"{self._token()}-{next(self._ids)}"
        future: asyncio.Future[bytes] = self._loop.create_future()
        deadline = time.time() + timeout
        exchange, key = route(queue)
        request = Outgoing(queue, exchange, key, request_bytes(op, deadline, body, accepts), deadline,
                           resend=exchange is not AGENT_EXCHANGE)
        self._pending[cid] = future
        self._requests[cid] = request
        try:
            if self._conn is not None:
                self._send(cid, request)  # else sent once reconnected
            return await wait_reply(future, op, queue, timeout)
        finally:
            self._pending.pop(cid, None)
            self._requests.pop(cid, None)
            if request.sent > 1:
                self._resent_answered[cid] = None
                while len(self._resent_answered) > _RESENT_MEMORY:
                    self._resent_answered.popitem(last=False)

    def _send(self, cid: str, request: Outgoing) -> None:
        """Publish ``request``; a broken connection is replaced and the request sent again from there."""
        assert self._publisher is not None and self._conn is not None
        try:
            if request.queue not in self._declared and request.exchange is not AGENT_EXCHANGE:
                # scheduling queues wait for their service; an agent declares its own queue
                request_queue(request.queue, self.options.delivery_limit)(self._conn.default_channel).declare()
                self._declared.add(request.queue)
                self._drain_soon()  # frames a TLS socket decrypted during the declaration wait there
            self._publisher.publish(
                request.payload,
                exchange=request.exchange,
                routing_key=request.key,
                headers=_REPLY_HEADERS,
                content_type="application/json",
                content_encoding="utf-8",
                correlation_id=cid,
                reply_to=self._reply_queue,
                expiration=max(0.001, request.deadline - time.time()),
                confirm_timeout=self.options.confirm_timeout,
                retry=False,
            )
        except CONNECTION_ERRORS as exc:
            request.failed += 1
            future = self._pending.get(cid)
            if request.failed >= _MAX_SENDS and future is not None and not future.done():  # e.g. a queue refused
                future.set_exception(BusUnavailable(f"message bus unavailable: {mask(str(exc)) or type(exc).__name__}"))
            self._lost(exc)  # else not sent: goes out again once reconnected
            return
        request.sent += 1
        if self.options.confirms:
            assert self._loop is not None
            self._confirms.published(cid, self._loop)

    def _confirm_overdue(self, cid: str) -> None:
        """No confirm in time: a scheduling request is sent again, up to _MAX_SENDS copies; else it fails."""
        request, future = self._requests.get(cid), self._pending.get(cid)
        if request is None or future is None or future.done():
            return
        if not request.resend or request.sent >= _MAX_SENDS or request.deadline <= time.time():
            future.set_exception(BusUnavailable(f"no publisher confirm within {self.options.confirm_timeout:g} s"))
        elif self._conn is not None:  # else it goes out again once reconnected
            metrics.BUS_RESENT.labels(self.service, "confirm_timeout").inc()
            log.info("%s: request %s to %s sent again (no confirm)", self.service, cid, request.queue)
            self._send(cid, request)

    def _send_waiting(self) -> None:
        """After a reconnection: send what waited for it, and again the scheduling requests sent before."""
        now = time.time()
        for cid, request in list(self._requests.items()):
            future = self._pending.get(cid)
            if self._conn is None:
                return  # lost again: the next reconnection sends them
            if future is None or future.done() or request.deadline <= now or (request.sent and not request.resend):
                continue
            if request.sent:
                metrics.BUS_RESENT.labels(self.service, request.why).inc()
                request.why = "reconnect"
            self._send(cid, request)

    def _fail_all(self, error: Exception, only_unrepeatable: bool = False) -> None:
        """Fail the calls waiting (``only_unrepeatable``: those to agents already sent, never sent twice)."""
        for cid, future in list(self._pending.items()):
            request = self._requests.get(cid)
            if only_unrepeatable and (request is None or request.resend or not request.sent):
                continue
            if not future.done():
                future.set_exception(error)

    # --- connection plumbing ----------------------------------------------
    def _connect(self) -> Connection:
        """Open a connection and create the exchanges (the gateway's user may: docs/deploy/broker-users.md)."""
        conn = open_connection(self.options)
        try:
            ensure_exchanges(conn, EXCHANGES)
        except BaseException:
            safe_release(conn)
            raise
        return conn

    def _attach(self, conn: Connection) -> None:
        try:
            self._subscribe(conn)
        except BaseException:
            note_lost(conn)
            safe_release(conn)
            raise
        self._conn = conn
        self._recovering = False
        metrics.BUS_UP.labels(self.service).set(1)
        self._last_error = ""
        self._send_waiting()

    def _subscribe(self, conn: Connection) -> None:
        assert self._loop is not None
        channel = conn.default_channel
        # a new name each time: the old queue may outlive its connection on the broker for a moment
        self._reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"
        self._consumer = Consumer(channel, [reply_queue(self._reply_queue)], on_message=self._on_reply, no_ack=True)
        self._consumer.consume()
        self._declared = set()
        for name in self._declare:
            request_queue(name, self.options.delivery_limit)(channel).declare()
            self._declared.add(name)
        self._publisher = Producer(channel, auto_declare=False)
        if self.options.confirms:
            self._confirms.reset(channel)  # a refused or missing confirm sends the request again or fails it
        self._fd = conn.connection.sock.fileno()
        self._loop.add_reader(self._fd, self._drain)
        self._drain_soon()  # what a TLS socket decrypted during the subscription's synchronous calls

    def _detach(self) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
        self._fd = None
        safe_release(self._conn)
        self._conn = self._publisher = self._consumer = None
        metrics.BUS_UP.labels(self.service).set(0)

    def _lost(self, exc: BaseException, recovering: bool = True) -> None:
        self._last_error = f"{type(exc).__name__}: {mask(str(exc))}" if str(exc) else type(exc).__name__
        log.warning("%s: bus connection lost (%s)", self.service, self.last_error)
        note_lost(self._conn)
        self._detach()
        error = BusUnavailable(f"message bus connection lost: {self.last_error}")
        if recovering and not self._closed:
            self._recovering = True  # scheduling requests wait for the next connection
            self._fail_all(error, only_unrepeatable=True)  # an agent's request is never sent twice
        else:
            self._fail_all(error)
        if not self._closed and (self._reconnect_task is None or self._reconnect_task.done()):
            assert self._loop is not None
            self._reconnect_task = self._loop.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        assert self._loop is not None
        attempt = 0
        while not self._closed and self._conn is None:
            await asyncio.sleep(backoff(attempt, self.options.reconnect_max_delay))
            attempt += 1
            try:
                conn = await self._loop.run_in_executor(None, self._connect)
            except CONNECTION_ERRORS as exc:
                self._last_error = f"{type(exc).__name__}: {mask(str(exc))}"
                if self._recovering:  # no node answers: fail fast until one does
                    self._recovering = False
                    self._fail_all(BusUnavailable(f"message bus unavailable: {self.last_error}"))
                continue
            if self._closed:
                safe_release(conn)
                return
            metrics.BUS_RECONNECTS.labels(self.service).inc()
            log.info("%s: reconnected to the bus at %s", self.service, mask(getattr(conn, "bus_url", "")))
            try:
                self._attach(conn)
            except CONNECTION_ERRORS as exc:
                self._lost(exc, recovering=self._recovering)

    async def _heartbeats(self) -> None:
        while not self._closed:
            await asyncio.sleep(max(1.0, self.options.heartbeat / 3))
            if self._conn is not None:
                try:
                    self._conn.heartbeat_check()
                except CONNECTION_ERRORS as exc:
                    self._lost(exc)

    def _drain(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            with nonblocking(conn.connection.sock):
                while True:
                    conn.drain_events(timeout=0)
        except socket.timeout:
            return
        except BlockingIOError:
            return
        except CONNECTION_ERRORS as exc:  # also ConsumerCancelled: the reply queue was deleted (its node died)
            if self._conn is conn:
                self._lost(exc)

    def _drain_soon(self) -> None:
        """Drain soon what a synchronous call (a declaration) left decrypted in a TLS socket: the loop cannot
        see it."""
        conn = self._conn
        if conn is not None and self._loop is not None and buffered(conn.connection.sock):
            self._loop.call_soon(self._drain)

    def _on_nack(self, cids: list[str]) -> None:
        """A quorum queue nacks while it elects a leader, and RabbitMQ (3.10) then nacks every later publish
        of that channel to it: the requests go out again on a new connection."""
        error = BusUnavailable("the broker refused the request (publisher nack)")
        again = False
        for cid in cids:
            request, future = self._requests.get(cid), self._pending.get(cid)
            if request is None or future is None or future.done():
                continue
            if request.resend and request.deadline > time.time() and request.sent < _MAX_SENDS:
                request.why, again = "nack", True
            else:
                future.set_exception(error)
        if again and self._loop is not None:
            conn = self._conn
            self._loop.call_soon(lambda: self._conn is conn and conn is not None and self._lost(error))

    def _on_reply(self, message: Message) -> None:
        body = message.body
        self._resolve(message.properties.get("correlation_id"), body if isinstance(body, bytes) else str(body).encode())

    def _resolve(self, cid: str | None, body: bytes) -> None:
        future = self._pending.get(cid) if cid else None
        if future is None or future.done():
            if cid in self._resent_answered or (cid in self._requests and self._requests[cid].sent > 1):
                metrics.BUS_DUPLICATE_REPLIES.labels(self.service).inc()
            return  # else the caller gave up already
        future.set_result(body)
