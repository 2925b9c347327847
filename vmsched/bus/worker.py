"""A service worker: consume request queues, call a handler, reply, then ack.

Connection handling, acks, deadlines, reconnects and request metrics live
here once; a service is a mapping of queue name to handler. Each consumer
thread owns its connection and channel (kombu objects are not thread-safe).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable

from kombu import Connection, Consumer, Producer
from kombu.message import Message
import json

from pydantic import BaseModel, ValidationError

from vmsched import metrics
from vmsched.bus import RequestError
from vmsched.bus.connection import BusOptions, ensure_exchanges
from vmsched.bus.topology import DEAD_EXCHANGE, PING, REPLY_EXCHANGE, REPLY_VIA, dead_letter_queue, is_versioned, \
    request_queue, route
from vmsched.bus.loop import run_reconnecting
from vmsched.messages import CONTRACT_VERSION, Envelope, ErrorCode, ReplyEnvelope, request_units

log = logging.getLogger("vmsched.bus")

#: A handler returns the reply body: a typed model (serialized once, directly) or a dict.
Handler = Callable[[Envelope], "BaseModel | dict"]


class ServiceWorker:
    def __init__(
        self,
        url: str | BusOptions,
        service: str,
        queue: str | None = None,
        handler: Handler | None = None,
        *,
        routes: dict[str, Handler] | None = None,
        consumers: int = 1,
        prefetch: int = 2,
    ) -> None:
        self.options = url if isinstance(url, BusOptions) else BusOptions(url=url)
        self.service = service
        self.routes: dict[str, Handler] = dict(routes or {})
        if queue is not None and handler is not None:
            self.routes[queue] = handler
        if not self.routes:
            raise ValueError("a worker needs at least one queue and handler")
        self.consumers = consumers
        self.prefetch = prefetch
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._connected = 0
        self._lock = threading.Lock()
        self.ready = threading.Event()  # set once every consumer has subscribed at least once

    # --- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        for i in range(self.consumers):
            t = threading.Thread(target=self._run, name=f"{self.service}-consumer-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()

    @property
    def connected(self) -> bool:
        return self._connected > 0

    # --- consumer loop -----------------------------------------------------
    def _run(self) -> None:
        run_reconnecting(self.options.without_confirms(), self.service, self._stop, self._serve, self._reconnected)

    def _reconnected(self) -> None:
        metrics.BUS_RECONNECTS.labels(self.service).inc()
        log.info("%s: reconnected to the bus", self.service)

    def _serve(self, conn: Connection) -> None:
        ensure_exchanges(conn, {route(name)[0].name: route(name)[0] for name in self.routes}.values())
        ensure_exchanges(conn, (REPLY_EXCHANGE, DEAD_EXCHANGE))
        channel = conn.channel()
        channel.basic_qos(0, self.prefetch, False)
        producer = Producer(channel, auto_declare=False)
        limit = self.options.delivery_limit
        # a request past its delivery limit is answered from its dead-letter queue (declared first: a
        # quorum queue drops what it dead-letters to an exchange without a bound queue)
        consumers = [
            Consumer(channel, [dead_letter_queue(name)], on_message=self._dead_callback(name, producer), no_ack=False)
            for name in self.routes if is_versioned(name)
        ] + [
            Consumer(channel, [request_queue(name, limit)], on_message=self._callback(name, producer), no_ack=False)
            for name in self.routes
        ]
        for consumer in consumers:
            consumer.consume()
        self._set_connected(+1)
        try:
            self.ready.set()
            while not self._stop.is_set():
                try:
                    conn.drain_events(timeout=1.0)
                except socket.timeout:
                    conn.heartbeat_check()
        finally:
            self._set_connected(-1)

    def _callback(self, queue: str, producer: Producer) -> Callable[[Message], None]:
        return lambda message: self._on_message(queue, message, producer)

    def _dead_callback(self, queue: str, producer: Producer) -> Callable[[Message], None]:
        return lambda message: self._on_dead(queue, message, producer)

    def _set_connected(self, delta: int) -> None:
        with self._lock:
            self._connected += delta
            metrics.BUS_UP.labels(self.service).set(1 if self._connected else 0)

    # --- one message -------------------------------------------------------
    def _on_message(self, queue: str, message: Message, producer: Producer) -> None:
        failed = (message.headers or {}).get("x-delivery-count")  # quorum queues: earlier deliveries not acked
        if failed:
            log.warning("%s: request %s on %s delivered again (delivery %d of at most %d): the consumer of an "
                        "earlier delivery died handling it", self.service, message.properties.get("correlation_id"),
                        queue, int(failed) + 1, self.options.delivery_limit)
        self._send(message, self._handle(queue, message.body), producer)
        message.ack()  # only after the reply is out: a killed worker means redelivery

    def _on_dead(self, queue: str, message: Message, producer: Producer) -> None:
        """A request past its delivery limit: answered with an error naming its units, never run again."""
        self._send(message, self._dead_reply(queue, message.body, message.properties.get("correlation_id")), producer)
        message.ack()

    def _dead_reply(self, queue: str, body: bytes | str, cid: str | None) -> bytes | None:
        try:
            env = Envelope.model_validate_json(body)
        except ValidationError:
            return None  # cannot be: a malformed request is answered on its first delivery
        if env.remaining() <= 0:
            log.info("%s: dropped a dead-lettered %s request past its deadline", self.service, env.op)
            return None
        units = request_units(env.body)
        metrics.REQUESTS.labels(self.service, env.op, "dead_lettered").inc()
        log.error("%s: %s request %s dead-lettered after %d deliveries on %s, each of which killed its consumer; "
                  "units: %s", self.service, env.op, cid, self.options.delivery_limit, queue,
                  ", ".join(units) or "none")
        reply = ReplyEnvelope(
            ok=False, code=ErrorCode.INTERNAL, details=units,
            error=(f"{self.service}: {env.op} request not run: its {self.options.delivery_limit} deliveries each "
                   f"killed the {self.service} process handling it (dead-lettered); units: {', '.join(units) or 'none'}"))
        return _legacy(reply) if env.version == 1 else _dump(reply)

    def _send(self, message: Message, reply: bytes | None, producer: Producer) -> None:
        reply_to = message.properties.get("reply_to")
        if reply is not None and reply_to:
            # the reply exchange when the sender asks for it; a sender older than the exchanges waits on the
            # default exchange (its user may still publish there: docs/upgrading.md)
            via = (message.headers or {}).get(REPLY_VIA)
            producer.publish(
                reply,
                routing_key=reply_to,
                exchange=REPLY_EXCHANGE if via == REPLY_EXCHANGE.name else "",
                content_type="application/json",
                content_encoding="utf-8",
                correlation_id=message.properties.get("correlation_id"),
                retry=False,
            )

    def _handle(self, queue: str, body: bytes | str) -> bytes | None:
        reply = self._reply(queue, body)
        return _dump(reply) if isinstance(reply, ReplyEnvelope) else reply

    def _reply(self, queue: str, body: bytes | str) -> ReplyEnvelope | bytes | None:
        try:
            env = Envelope.model_validate_json(body)
        except ValidationError as exc:
            metrics.REQUESTS.labels(self.service, "invalid", "error").inc()
            return ReplyEnvelope(ok=False, error=f"malformed request: {_first_error(exc)}", code=ErrorCode.INVALID)
        problem = env.version_problem()
        if problem is not None:
            metrics.REQUESTS.labels(self.service, "invalid", "error").inc()
            return ReplyEnvelope(ok=False, error=f"{self.service}: request of {problem}",
                                 code=ErrorCode.UNSUPPORTED_VERSION)
        if env.op == PING:
            return ReplyEnvelope(ok=True, body={"service": self.service})
        if env.remaining() <= 0:
            metrics.BUS_EXPIRED.labels(self.service, env.op).inc()
            log.info("%s: dropped expired %s request (caller gave up)", self.service, env.op)
            return None
        handler = self.routes.get(queue)
        if handler is None:
            return ReplyEnvelope(ok=False, error=f"no handler for queue {queue!r}", code=ErrorCode.INTERNAL)
        reply = self._invoke(handler, env)
        if isinstance(reply, ReplyEnvelope) and env.version == 1:
            reply = _legacy(reply)
        return reply

    def _invoke(self, handler: Handler, env: Envelope) -> ReplyEnvelope | bytes:
        op = env.op
        in_flight = metrics.IN_FLIGHT.labels(self.service, op)
        in_flight.inc()
        started = time.perf_counter()
        outcome = "ok"
        try:
            return _ok(handler(env))
        except RequestError as exc:
            outcome = "error"
            return ReplyEnvelope(ok=False, error=str(exc), code=exc.code, details=exc.details)
        except ValidationError as exc:
            outcome = "error"
            details = [_describe(err) for err in exc.errors()]
            return ReplyEnvelope(ok=False, error=f"invalid {op} request: {'; '.join(details)}",
                                 code=ErrorCode.INVALID, details=details)
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the consumer
            outcome = "error"
            log.exception("%s: %s handler failed", self.service, op)
            return ReplyEnvelope(ok=False, error=f"internal error in {self.service}: {type(exc).__name__}: {exc}",
                                 code=ErrorCode.INTERNAL)
        finally:
            in_flight.dec()
            metrics.REQUESTS.labels(self.service, op, outcome).inc()
            metrics.REQUEST_DURATION.labels(self.service, op).observe(time.perf_counter() - started)


def _ok(result: BaseModel | dict) -> bytes:
    """The success reply, serialized in one pass (same shape as ReplyEnvelope)."""
    body = result.model_dump_json() if isinstance(result, BaseModel) else json.dumps(result)
    return _OK_PREFIX + body.encode() + b"}"


_OK_PREFIX = b'{"v":%d,"ok":true,"error":null,"body":' % CONTRACT_VERSION


def _dump(reply: ReplyEnvelope) -> bytes:
    """An error reply without an empty body: a typed reader (TypedReply) reads a missing body as none."""
    return reply.model_dump_json(exclude={"body"} if not reply.body else None).encode()


def _legacy(reply: ReplyEnvelope) -> bytes:
    """The reply to a version-1 sender, in its words: no new fields, the code inside the error text."""
    error = f"{reply.code}: {reply.error}" if reply.code and not reply.ok else reply.error
    return json.dumps({"ok": reply.ok, "error": error, "body": reply.body}).encode()


def _first_error(exc: ValidationError) -> str:
    return _describe(exc.errors()[0])


def _describe(err: dict) -> str:
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err['msg']}" if where else err["msg"]
