"""Opening kombu connections to RabbitMQ, and the errors that mean "the broker went away"."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterable

import amqp.connection
import amqp.exceptions
from kombu import Connection, Exchange
from kombu.transport import pyamqp

from vmsched.bus import BusUnavailable
from vmsched.bus.options import BusOptions, mask

#: Exceptions that mean the connection is unusable and must be reopened.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    socket.timeout,
    amqp.exceptions.ConnectionError,
    amqp.exceptions.ChannelError,
    amqp.exceptions.RecoverableConnectionError,
    amqp.exceptions.IrrecoverableConnectionError,
    BusUnavailable,
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


def open_connection(options: BusOptions, blocking_confirms: bool = False) -> Connection:
    """Connect now to one of the broker's nodes (raises one of :data:`CONNECTION_ERRORS` when none answers).

    The nodes are tried in order, those that failed in the last :data:`FAILED_NODE_PENALTY` seconds last, each
    for ``connect_timeout`` (kombu's own failover would try only two of them per connect and drop the custom
    transport and each node's TLS host name on the way). ``blocking_confirms``: every publish waits for the
    broker's confirm (simple callers); the gateway client instead handles confirms asynchronously.
    """
    if options.embedded:
        raise ValueError("memory:// is the in-process bus, not a broker: open it with "
                         "vmsched.bus.transport.open_transport and hand it to every party of the process")
    urls = _by_preference(options.urls)
    errors: list[str] = []
    for url in urls:
        try:
            return _open(options, url, blocking_confirms)
        except CONNECTION_ERRORS as exc:
            _note_failure(url)
            if len(urls) == 1:
                raise
            errors.append(f"{mask(url)}: {type(exc).__name__}: {mask(str(exc))}")
    raise BusUnavailable(f"no broker node answers ({'; '.join(errors)})")


def _open(options: BusOptions, url: str, blocking_confirms: bool) -> Connection:
    conn = Connection(
        url,
        transport=_TRANSPORTS.get(url.split("://", 1)[0]),
        connect_timeout=options.connect_timeout,
        heartbeat=options.heartbeat,
        ssl=options.ssl_options(url) or False,
        transport_options={"confirm_publish": blocking_confirms and options.confirms},
    )
    try:
        conn.connect()
    except BaseException:
        drop(conn)  # a node that did not complete the handshake may not answer a closing one either
        raise
    with _failed_lock:
        _failed_at.pop(url, None)
    conn.bus_url = url  # type: ignore[attr-defined]  # which node: note_lost()
    return conn


def note_lost(conn: Connection | None) -> None:
    """``conn`` broke: its node is tried after the others at the next connection."""
    url = getattr(conn, "bus_url", None)
    if url is not None:
        _note_failure(url)


#: Seconds a node that refused a connection is tried after the others.
FAILED_NODE_PENALTY = 30.0
_failed_at: dict[str, float] = {}
_failed_lock = threading.Lock()


def _note_failure(url: str) -> None:
    with _failed_lock:
        _failed_at[url] = time.monotonic()


def _by_preference(urls: tuple[str, ...]) -> list[str]:
    now = time.monotonic()
    with _failed_lock:
        recent = {u for u, at in _failed_at.items() if now - at < FAILED_NODE_PENALTY}
    return sorted(urls, key=lambda u: u in recent)  # stable: the configured order otherwise


def ensure_exchanges(conn: Connection, exchanges: Iterable[Exchange]) -> None:
    """Make sure ``exchanges`` exist: look first (no permission needed), declare only what is missing.

    A component whose broker user may not configure an exchange waits for the
    gateway (or the broker's definitions) to create it: :class:`BusUnavailable`
    says which one, and the caller retries like after any connection failure.
    """
    for exchange in exchanges:
        channel = conn.channel()
        try:
            channel.exchange_declare(exchange=exchange.name, type=exchange.type, durable=exchange.durable,
                                     auto_delete=exchange.auto_delete, passive=True)
            continue
        except amqp.exceptions.NotFound:
            pass  # the broker closed that channel
        finally:
            _close(channel)
        channel = conn.channel()
        try:
            channel.exchange_declare(exchange=exchange.name, type=exchange.type, durable=exchange.durable,
                                     auto_delete=exchange.auto_delete)
        except amqp.exceptions.AccessRefused:
            raise BusUnavailable(f"exchange {exchange.name!r} does not exist yet and this broker user may not create "
                                 "it; the gateway or deploy/rabbitmq/setup-users.sh creates it") from None
        finally:
            _close(channel)


def _close(channel: object) -> None:
    try:
        channel.close()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a channel the broker closed already
        pass


def backoff(attempt: int, max_delay: float) -> float:
    """Bounded exponential backoff: 0.1, 0.2, 0.4 ... max_delay seconds."""
    return min(max_delay, 0.1 * (2 ** min(attempt, 10)))


def safe_release(conn: Connection | None) -> None:
    """Close ``conn`` with the broker (its channels, then the connection): waits for the broker's answers."""
    if conn is None:
        return
    try:
        conn.release()
    except Exception:  # noqa: BLE001 - the connection is being thrown away
        pass


def drop(conn: Connection | None) -> None:
    """Throw ``conn`` away without a word to the broker (kombu's ``collect``: the socket is closed, nothing is
    sent or awaited): for a connection that broke, or whose broker stopped answering."""
    if conn is None:
        return
    try:
        conn.collect()
    except Exception:  # noqa: BLE001 - the connection is being thrown away
        pass
