"""The gateway's RPC client: kombu driven from the asyncio event loop.

Everything happens on the loop thread, so the connection is never shared
between threads and no message is handed between threads: the loop watches
the broker socket (or, embedded, a wake-up pipe of the reply queue) and
drains it without blocking; publishing is a socket write plus, on RabbitMQ,
a publisher confirm bounded by ``confirm_timeout``. Replies are matched to
callers by correlation id. While the broker is down, calls fail at once with
:class:`BusUnavailable` and a background task reconnects with bounded backoff.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import socket
import time
import uuid
from typing import Any, TypeVar, overload

from kombu import Connection, Consumer, Producer
from kombu.message import Message
from pydantic import BaseModel, ValidationError

from vmsched import metrics
from vmsched.bus import BusTimeout, BusUnavailable, RequestError, reply_error
from vmsched.bus.connection import CONNECTION_ERRORS, BusOptions, backoff, ensure_exchanges, open_connection, \
    safe_release
from vmsched.bus.memory import QueueWatch
from vmsched.bus.topology import AGENT_EXCHANGE, EXCHANGES, PING, REPLY_EXCHANGE, REPLY_VIA, reply_queue, request_queue, route
from vmsched.bus.urls import mask
from vmsched.messages import Envelope, ReplyEnvelope, TypedReply

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

log = logging.getLogger("vmsched.bus")

_REPLY_HEADERS = {REPLY_VIA: REPLY_EXCHANGE.name}


class AsyncBusClient:
    def __init__(self, options: BusOptions, declare: tuple[str, ...] = (), service: str = "gateway") -> None:
        self.options = options
        self.service = service
        self._declare = declare
        self._reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"
        self._ids = itertools.count()
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._conn: Connection | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._watch: QueueWatch | None = None
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._declared: set[str] = set()
        self._tag = 0  # last publish delivery tag on the confirm channel
        self._unconfirmed: dict[int, str] = {}  # delivery tag -> correlation id
        self.last_error: str = "not connected yet"
        self._closed = False

    # --- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._attach(await self._loop.run_in_executor(None, self._connect))
        except CONNECTION_ERRORS as exc:
            self._lost(exc)
        self._heartbeat_task = self._loop.create_task(self._heartbeats())

    async def close(self) -> None:
        self._closed = True
        for task in (self._reconnect_task, self._heartbeat_task):
            if task is not None:
                task.cancel()
        self._detach(BusUnavailable("gateway shutting down"))

    @property
    def connected(self) -> bool:
        return self._conn is not None

    # --- calls ---------------------------------------------------------------
    @overload
    async def call(self, queue: str, op: str, body: dict[str, Any], timeout: float) -> dict[str, Any]: ...

    @overload
    async def call(self, queue: str, op: str, body: dict[str, Any], timeout: float, model: type[M]) -> M: ...

    async def call(
        self, queue: str, op: str, body: dict[str, Any], timeout: float, model: type[M] | None = None
    ) -> dict[str, Any] | M:
        """Send a request and wait for its reply body, at most ``timeout`` seconds.

        With ``model`` the reply is parsed in one pass into that type. An error
        reply (of this contract version or the previous one) raises
        :class:`RequestError` carrying the reply's ``code``.
        """
        reply_type = TypedReply[model] if model else ReplyEnvelope  # type: ignore[valid-type]
        reply = await self.request(queue, op, body, timeout, reply_type)
        error = reply_error(reply, queue)
        if error is not None:
            raise error
        return reply.body

    async def request(
        self, queue: str, op: str, body: dict[str, Any], timeout: float, reply_type: type[R] = ReplyEnvelope
    ) -> R:
        """Send a request and return its whole reply (ok or not), parsed as ``reply_type``."""
        raw = await self._roundtrip(queue, op, body, timeout)
        try:
            return reply_type.model_validate_json(raw)
        except ValidationError as exc:
            raise RequestError(f"malformed reply from {queue}: {exc.errors()[0]['msg']}", "internal") from None

    async def _roundtrip(self, queue: str, op: str, body: dict[str, Any], timeout: float) -> bytes:
        if self._conn is None or self._producer is None:
            raise BusUnavailable(f"message bus unavailable: {self.last_error}")
        assert self._loop is not None
        # unguessable, so that no other user of the reply exchange can answer in an agent's place
        cid = f"{secrets.token_hex(8)}-{next(self._ids)}"
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._pending[cid] = future
        envelope = Envelope(op=op, deadline=time.time() + timeout, body=body)
        try:
            self._publish(queue, envelope, cid, timeout)
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise BusTimeout(f"no {op} reply from {queue} within {timeout:g} s") from None
        finally:
            self._pending.pop(cid, None)

    async def ping(self, queue: str, timeout: float = 1.0) -> bool:
        try:
            return (await self.request(queue, PING, {}, timeout)).ok
        except (BusTimeout, BusUnavailable):
            return False

    def _publish(self, queue: str, envelope: Envelope, cid: str, timeout: float) -> None:
        assert self._producer is not None and self._conn is not None
        try:
            exchange, key = route(queue)
            if queue not in self._declared and exchange is not AGENT_EXCHANGE:
                # scheduling queues wait for their service; an agent declares its own queue
                request_queue(queue, self.options.delivery_limit)(self._conn.default_channel).declare()
                self._declared.add(queue)
            self._producer.publish(
                envelope.model_dump_json().encode(),
                routing_key=key,
                exchange=exchange,
                headers=_REPLY_HEADERS,
                content_type="application/json",
                content_encoding="utf-8",
                correlation_id=cid,
                reply_to=self._reply_queue,
                expiration=timeout,
                retry=False,
                confirm_timeout=self.options.confirm_timeout,
            )
        except CONNECTION_ERRORS as exc:
            self._lost(exc)
            raise BusUnavailable(f"message bus unavailable: {exc}") from None
        if self.options.confirms and not self.options.embedded:
            self._tag += 1
            self._unconfirmed[self._tag] = cid
            assert self._loop is not None
            self._loop.call_later(self.options.confirm_timeout, self._confirm_overdue, self._tag)

    # --- connection plumbing ----------------------------------------------
    def _connect(self) -> Connection:
        """Open a connection and create the exchanges (the gateway's user may: docs/deploy.md)."""
        conn = open_connection(self.options)
        try:
            ensure_exchanges(conn, EXCHANGES)
        except BaseException:
            safe_release(conn)
            raise
        return conn

    def _attach(self, conn: Connection) -> None:
        assert self._loop is not None
        channel = conn.default_channel
        self._consumer = Consumer(channel, [reply_queue(self._reply_queue)], on_message=self._on_reply, no_ack=True)
        self._consumer.consume()
        self._declared = set()
        for name in self._declare:
            request_queue(name, self.options.delivery_limit)(channel).declare()
            self._declared.add(name)
        self._producer = Producer(channel, auto_declare=False)
        self._tag = 0
        self._unconfirmed.clear()
        if self.options.confirms and not self.options.embedded:
            # Confirms are awaited asynchronously: the broker's basic.ack or
            # basic.nack arrives like any frame; a missing one fails the call.
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
        if self.options.embedded:
            self._watch = QueueWatch(self._reply_queue)
            self._fd = self._watch.fd
        else:
            self._fd = conn.connection.sock.fileno()
        self._loop.add_reader(self._fd, self._drain)
        self._conn = conn
        metrics.BUS_UP.labels(self.service).set(1)
        self.last_error = ""

    def _detach(self, error: Exception) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
        self._fd = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        safe_release(self._conn)
        self._conn = self._producer = self._consumer = None
        metrics.BUS_UP.labels(self.service).set(0)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)

    def _lost(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {mask(str(exc))}" if str(exc) else type(exc).__name__
        log.warning("%s: bus connection lost (%s)", self.service, self.last_error)
        self._detach(BusUnavailable(f"message bus connection lost: {self.last_error}"))
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
                self.last_error = f"{type(exc).__name__}: {mask(str(exc))}"
                continue
            self._attach(conn)
            metrics.BUS_RECONNECTS.labels(self.service).inc()
            log.info("%s: reconnected to the bus", self.service)

    async def _heartbeats(self) -> None:
        while not self._closed:
            await asyncio.sleep(max(1.0, self.options.heartbeat / 3))
            if self._conn is not None and not self.options.embedded:
                try:
                    self._conn.heartbeat_check()
                except CONNECTION_ERRORS as exc:
                    self._lost(exc)

    def _drain(self) -> None:
        conn = self._conn
        if conn is None:
            return
        if self._watch is not None:
            self._watch.clear()
        try:
            while True:
                conn.drain_events(timeout=0)
        except socket.timeout:
            return
        except BlockingIOError:
            return
        except CONNECTION_ERRORS as exc:
            if self._conn is conn:
                self._lost(exc)

    def _settle(self, tag: int, multiple: bool) -> list[str]:
        tags = [t for t in self._unconfirmed if t <= tag] if multiple else [tag]
        return [cid for t in tags if (cid := self._unconfirmed.pop(t, None)) is not None]

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        for cid in self._settle(tag, multiple):
            self._fail(cid, BusUnavailable("the broker refused the request (publisher nack)"))

    def _confirm_overdue(self, tag: int) -> None:
        cid = self._unconfirmed.pop(tag, None)
        if cid is not None:
            self._fail(cid, BusUnavailable(f"no publisher confirm within {self.options.confirm_timeout:g} s"))

    def _fail(self, cid: str, error: Exception) -> None:
        future = self._pending.get(cid)
        if future is not None and not future.done():
            future.set_exception(error)

    def _on_reply(self, message: Message) -> None:
        cid = message.properties.get("correlation_id")
        future = self._pending.get(cid) if cid else None
        if future is None or future.done():
            return  # the caller gave up already
        body = message.body
        future.set_result(body if isinstance(body, bytes) else str(body).encode())
