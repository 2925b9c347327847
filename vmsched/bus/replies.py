"""What a service worker answers to one request: run its handler, or refuse it; serialized once.

The worker (:mod:`vmsched.bus.rabbitmq.worker`) moves messages; this module turns a request body into
reply bytes: the handler's result, a precise error, or the error of a dead-lettered request.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable

from pydantic import BaseModel, ValidationError

from vmsched import metrics
from vmsched.bus import RequestError
from vmsched.bus.topology import PING
from vmsched.messages import CONTRACT_VERSION, Envelope, ErrorCode, ReplyEnvelope, request_units

log = logging.getLogger("vmsched.bus")

#: A handler returns the reply body: a typed model (serialized once, directly) or a dict.
Handler = Callable[[Envelope], "BaseModel | dict"]


class Replier:
    def __init__(self, service: str, routes: dict[str, Handler], delivery_limit: int) -> None:
        self.service = service
        self.routes = routes
        self.delivery_limit = delivery_limit

    def dead(self, queue: str, body: bytes | str, cid: str | None, why: str) -> bytes | None:
        """The error reply to a request never to be run again: it names its units and ``why``."""
        try:
            env = Envelope.model_validate_json(body)
        except ValidationError:
            return None  # cannot be: a malformed request is answered on its first delivery
        if env.remaining() <= 0:
            log.info("%s: dropped a dead-lettered %s request past its deadline", self.service, env.op)
            return None
        units = request_units(env.body)
        metrics.REQUESTS.labels(self.service, env.op, "dead_lettered").inc()
        log.error("%s: %s request %s dead-lettered on %s (%s); units: %s", self.service, env.op, cid, queue, why,
                  ", ".join(units) or "none")
        reply = ReplyEnvelope(
            ok=False, code=ErrorCode.INTERNAL, details=units,
            error=(f"{self.service}: {env.op} request not run: {why} (dead-lettered, at most "
                   f"{self.delivery_limit} deliveries); units: {', '.join(units) or 'none'}"))
        return _dump(reply)

    def handle(self, queue: str, body: bytes | str) -> bytes | None:
        """The reply to a request on ``queue`` (None: nobody waits for one)."""
        try:
            env = Envelope.model_validate_json(body)
        except ValidationError as exc:
            metrics.REQUESTS.labels(self.service, "invalid", "error").inc()
            return _dump(ReplyEnvelope(ok=False, error=f"malformed request: {_describe(exc.errors()[0])}",
                                       code=ErrorCode.INVALID))
        problem = env.version_problem()
        if problem is not None:
            metrics.REQUESTS.labels(self.service, "invalid", "error").inc()
            return _dump(ReplyEnvelope(ok=False, error=f"{self.service}: request of {problem}",
                                       code=ErrorCode.UNSUPPORTED_VERSION))
        if env.op == PING:
            return _dump(ReplyEnvelope(ok=True, body={"service": self.service}))
        if env.remaining() <= 0:
            metrics.BUS_EXPIRED.labels(self.service, env.op).inc()
            log.info("%s: dropped expired %s request (caller gave up)", self.service, env.op)
            return None
        handler = self.routes.get(queue)
        if handler is None:
            return _dump(ReplyEnvelope(ok=False, error=f"no handler for queue {queue!r}", code=ErrorCode.INTERNAL))
        return self._invoke(handler, env)

    def _invoke(self, handler: Handler, env: Envelope) -> bytes:
        op = env.op
        in_flight = metrics.child(metrics.IN_FLIGHT, self.service, op)  # looked up once per series
        in_flight.inc()
        started = time.perf_counter()
        outcome = "ok"
        try:
            return _ok(handler(env))
        except RequestError as exc:
            outcome = "error"
            return _dump(ReplyEnvelope(ok=False, error=str(exc), code=exc.code, details=exc.details))
        except ValidationError as exc:
            outcome = "error"
            details = [_describe(err) for err in exc.errors()]
            return _dump(ReplyEnvelope(ok=False, error=f"invalid {op} request: {'; '.join(details)}",
                                       code=ErrorCode.INVALID, details=details))
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the consumer
            outcome = "error"
            log.exception("%s: %s handler failed", self.service, op)
            return _dump(ReplyEnvelope(ok=False, code=ErrorCode.INTERNAL,
                                       error=f"internal error in {self.service}: {type(exc).__name__}: {exc}"))
        finally:
            in_flight.dec()
            metrics.child(metrics.REQUESTS, self.service, op, outcome).inc()
            metrics.child(metrics.REQUEST_DURATION, self.service, op).observe(time.perf_counter() - started)


def _ok(result: BaseModel | dict) -> bytes:
    """The success reply, serialized in one pass (same shape as ReplyEnvelope)."""
    body = result.model_dump_json() if isinstance(result, BaseModel) else json.dumps(result)
    return _OK_PREFIX + body.encode() + b"}"


_OK_PREFIX = b'{"v":%d,"ok":true,"error":null,"body":' % CONTRACT_VERSION


def _dump(reply: ReplyEnvelope) -> bytes:
    """An error reply without an empty body: a typed reader (TypedReply) reads a missing body as none."""
    return reply.model_dump_json(exclude={"body"} if not reply.body else None).encode()


def _describe(err: dict) -> str:
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err['msg']}" if where else err["msg"]
