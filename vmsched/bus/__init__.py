"""The message bus: kombu connections, service workers and RPC clients.

The same code runs on RabbitMQ and on the embedded in-memory transport
(``memory://``, see :mod:`vmsched.bus.memory`).
"""

from __future__ import annotations


class BusError(Exception):
    """Base class of bus errors."""


class RequestError(BusError):
    """The service answered the request with an error (or refused it)."""


class BusUnavailable(BusError):
    """The broker cannot be reached, or the connection was lost."""


class BusTimeout(BusError):
    """No service answered before the request's deadline."""


__all__ = ["BusError", "RequestError", "BusUnavailable", "BusTimeout"]
