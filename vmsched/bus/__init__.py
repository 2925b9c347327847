"""The message bus: kombu connections, service workers and RPC clients.

The same code runs on RabbitMQ and on the embedded in-memory transport
(``memory://``, see :mod:`vmsched.bus.memory`).
"""

from __future__ import annotations

from typing import Iterable

from vmsched.messages import ErrorCode, ReplyEnvelope, TypedReply


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


_CODES = {c.value for c in ErrorCode}


def reply_error(reply: ReplyEnvelope | TypedReply, source: str = "the service") -> RequestError | None:
    """The error a reply carries (None for a usable success), for every version a reader accepts.

    A reply of a newer contract version than this reader's is an error
    (``unsupported_version``), not a guess. A version-1 error reply has no
    ``code``: its text is ``"code: message"``.
    """
    problem = reply.version_problem()
    if problem is not None:
        return RequestError(f"reply from {source}: {problem}", ErrorCode.UNSUPPORTED_VERSION.value)
    if reply.ok and reply.body is not None:
        return None
    message, code = reply.error or "request failed", reply.code
    if code is None and reply.version == 1:
        prefix, sep, rest = message.partition(": ")
        if sep and prefix in _CODES:
            code, message = prefix, rest
    return RequestError(message, code, reply.details)


__all__ = ["BusError", "RequestError", "BusUnavailable", "BusTimeout", "reply_error"]
