"""Opening kombu connections, and the errors that mean "the broker went away"."""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace

import amqp.connection
import amqp.exceptions
from kombu import Connection
from kombu.transport import pyamqp

from vmsched.bus import memory

#: Exceptions that mean the connection is unusable and must be reopened.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    socket.timeout,
    amqp.exceptions.ConnectionError,
    amqp.exceptions.ChannelError,
    amqp.exceptions.RecoverableConnectionError,
    amqp.exceptions.IrrecoverableConnectionError,
)


class _AmqpConnection(pyamqp.Connection):
    # Without `connection.blocked`, py-amqp's basic_publish no longer drains
    # incoming frames inline: a worker publishing its reply would otherwise
    # handle the next delivery (recursively) before its reply leaves. A
    # broker resource alarm then shows as a publisher-confirm timeout instead.
    negotiate_capabilities = {**amqp.connection.NEGOTIATE_CAPABILITIES, "connection.blocked": False}


class _AmqpTransport(pyamqp.Transport):
    Connection = _AmqpConnection


class _AmqpSSLTransport(pyamqp.SSLTransport):
    Connection = _AmqpConnection


_TRANSPORTS = {"amqp": _AmqpTransport, "pyamqp": _AmqpTransport, "amqps": _AmqpSSLTransport}


@dataclass(frozen=True)
class BusOptions:
    url: str
    connect_timeout: float = 2.0
    confirm_timeout: float = 2.0
    heartbeat: int = 10
    reconnect_max_delay: float = 5.0
    confirms: bool = True  # publisher confirms (RabbitMQ); replies go without

    def without_confirms(self) -> "BusOptions":
        return replace(self, confirms=False)

    @property
    def embedded(self) -> bool:
        return self.url.startswith("memory://")

    @classmethod
    def from_settings(cls, settings: object) -> "BusOptions":
        return cls(
            url=settings.amqp_url,  # type: ignore[attr-defined]
            connect_timeout=settings.connect_timeout,  # type: ignore[attr-defined]
            confirm_timeout=settings.confirm_timeout,  # type: ignore[attr-defined]
            reconnect_max_delay=settings.reconnect_max_delay,  # type: ignore[attr-defined]
        )


def open_connection(options: BusOptions, blocking_confirms: bool = False) -> Connection:
    """Connect now (raises one of :data:`CONNECTION_ERRORS` on failure).

    ``blocking_confirms``: every publish waits for the broker's confirm (simple
    callers); the gateway client instead handles confirms asynchronously.
    """
    if options.embedded:
        conn = Connection("memory://", transport=memory.Transport)
    else:
        conn = Connection(
            options.url,
            transport=_TRANSPORTS.get(options.url.split("://", 1)[0]),
            connect_timeout=options.connect_timeout,
            heartbeat=options.heartbeat,
            transport_options={"confirm_publish": blocking_confirms and options.confirms},
        )
    conn.connect()
    return conn


def backoff(attempt: int, max_delay: float) -> float:
    """Bounded exponential backoff: 0.1, 0.2, 0.4 ... max_delay seconds."""
    return min(max_delay, 0.1 * (2 ** min(attempt, 10)))


def safe_release(conn: Connection | None) -> None:
    if conn is None:
        return
    try:
        conn.release()
    except Exception:  # noqa: BLE001 - the connection is being thrown away
        pass
