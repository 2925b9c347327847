"""The message bus: one transport per process (:mod:`vmsched.bus.interface`), RabbitMQ through kombu
(:mod:`vmsched.bus.rabbitmq.broker`) or in-process (:mod:`vmsched.bus.inprocess`), and the errors of both."""

from __future__ import annotations

from typing import Any, Iterable

from pydantic import ValidationError

from vmsched.messages import ErrorCode, ReplyEnvelope, TypedReply

#: A reply as read: any operation's (:class:`ReplyEnvelope`) or one operation's (:class:`TypedReply`).
Reply = ReplyEnvelope | TypedReply


class BusError(Exception):
    """Base class of bus errors."""


class RequestError(BusError):
    """The service answered the request with an error (or refused it).

    ``code`` is the reply's :class:`~vmsched.messages.ErrorCode` value (None
    when the service gave none); ``details`` lists every reason of a refusal.
    """

    def __init__(self, message: str, code: str | None = None, details: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.details = list(details)


class BusUnavailable(BusError):
    """The broker cannot be reached, or the connection was lost."""


class BusTimeout(BusError):
    """No service answered before the request's deadline."""


def reply_error(reply: Reply, source: str = "the service") -> RequestError | None:
    """The error a reply carries (None for a usable success).

    A reply of another contract version than this reader's is an error (``unsupported_version``), not a guess.
    """
    problem = reply.version_problem()
    if problem is not None:
        return RequestError(f"reply from {source}: {problem}", ErrorCode.UNSUPPORTED_VERSION.value)
    if reply.ok and reply.body is not None:
        return None
    return RequestError(reply.error or "request failed", reply.code, reply.details)


def parse_reply(raw: bytes | str, queue: str, reply_type: type[Reply] = ReplyEnvelope) -> Reply:
    """A reply's bytes from ``queue`` read as ``reply_type``, ok or not; a malformed reply raises an error."""
    try:
        return reply_type.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestError(f"malformed reply from {queue}: {exc.errors()[0]['msg']}", ErrorCode.INTERNAL.value) \
            from None


def reply_body(raw: bytes | str, queue: str, reply_type: type[Reply] = ReplyEnvelope) -> Any:
    """The body of a reply's bytes from ``queue`` (read as ``reply_type``); an error reply (or a malformed one)
    raises its error."""
    reply = parse_reply(raw, queue, reply_type)
    error = reply_error(reply, queue)
    if error is not None:
        raise error
    return reply.body


__all__ = ["BusError", "RequestError", "BusUnavailable", "BusTimeout", "reply_error", "parse_reply", "reply_body"]
