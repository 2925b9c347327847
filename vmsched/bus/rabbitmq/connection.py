"""Opening kombu connections to RabbitMQ, the errors that mean "the broker went away", and a bus thread's wait
on its broker socket (through the socket's public API only)."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from contextlib import suppress
from typing import Any, Iterable
from urllib.parse import urlsplit

import amqp.connection
import amqp.exceptions
from kombu import Connection, Exchange, Producer
from kombu.transport import pyamqp

from vmsched.bus import BusUnavailable
from vmsched.bus.options import BusOptions, mask

#: Exceptions that mean the connection is unusable and must be reopened.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionError and socket.timeout too
    amqp.exceptions.ConnectionError,  # recoverable or not (ConsumerCancelled too)
    amqp.exceptions.ChannelError,
    BusUnavailable,
)


class AmqpConnection(pyamqp.Connection):
    """py-amqp's connection without the ``connection.blocked`` capability.

    With it, py-amqp's basic_publish drains incoming frames inline: a worker publishing its reply would handle
    the next delivery (recursively) before its reply leaves. A broker resource alarm then shows as a
    publisher-confirm timeout instead. The one place vmsched overrides a dependency's class attribute: py-amqp
    offers no public option for it. What it relies on is checked by tests/bus/test_wire.py, and py-amqp's
    version range is pinned in pyproject.toml.
    """

    negotiate_capabilities = {**amqp.connection.NEGOTIATE_CAPABILITIES, "connection.blocked": False}


class AmqpTransport(pyamqp.Transport):
    Connection = AmqpConnection


class AmqpSSLTransport(pyamqp.SSLTransport):
    Connection = AmqpConnection


TRANSPORTS = {"amqp": AmqpTransport, "pyamqp": AmqpTransport, "amqps": AmqpSSLTransport}


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
    now = time.monotonic()
    with _failed_lock:
        recent = {n for n, at in _failed_at.items() if now - at < FAILED_NODE_PENALTY}
    urls = sorted(options.urls, key=lambda u: _node_of(u) in recent)  # stable: the configured order otherwise
    errors: list[str] = []
    for url in urls:
        try:
            return _open(options, url, blocking_confirms)
        except CONNECTION_ERRORS as exc:
            _note_failure(_node_of(url))
            if len(urls) == 1:
                raise
            errors.append(f"{mask(url)}: {type(exc).__name__}: {mask(str(exc))}")
    raise BusUnavailable(f"no broker node answers ({'; '.join(errors)})")


def _open(options: BusOptions, url: str, blocking_confirms: bool) -> Connection:
    conn = Connection(
        url,
        transport=TRANSPORTS.get(url.split("://", 1)[0]),
        connect_timeout=options.connect_timeout,
        heartbeat=options.heartbeat,
        ssl=options.ssl_options(url) or False,
        transport_options={"confirm_publish": blocking_confirms},
    )
    try:
        conn.connect()
    except BaseException:
        drop(conn)  # a node that did not complete the handshake may not answer a closing one either
        raise
    with _failed_lock:
        _failed_at.pop(node(conn), None)
    return conn


def node(conn: Connection) -> str:
    """The broker node of ``conn``: ``host:port``."""
    return f"{conn.hostname}:{conn.port}"


def _node_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or (5671 if parts.scheme == 'amqps' else 5672)}"


def note_lost(conn: Connection | None) -> None:
    """``conn`` broke: its node is tried after the others at the next connection."""
    if conn is not None:
        _note_failure(node(conn))


#: Seconds a node that refused a connection is tried after the others.
FAILED_NODE_PENALTY = 30.0
_failed_at: dict[str, float] = {}
_failed_lock = threading.Lock()


def _note_failure(host_port: str) -> None:
    with _failed_lock:
        _failed_at[host_port] = time.monotonic()


def ensure_exchanges(conn: Connection, exchanges: Iterable[Exchange]) -> None:
    """Make sure ``exchanges`` exist: look first (no permission needed), declare only what is missing.

    A component whose broker user may not configure an exchange waits for the
    gateway (or the broker's definitions) to create it: :class:`BusUnavailable`
    says which one, and the caller retries like after any connection failure.
    """
    for exchange in exchanges:
        for passive in (True, False):  # a passive declaration needs no permission; a missing exchange: NotFound
            channel = conn.channel()
            try:
                channel.exchange_declare(exchange=exchange.name, type=exchange.type, durable=exchange.durable,
                                         auto_delete=exchange.auto_delete, passive=passive)
                break
            except amqp.exceptions.NotFound:
                pass  # the broker closed that channel; the exchange is declared on a new one
            except amqp.exceptions.AccessRefused:
                raise BusUnavailable(f"exchange {exchange.name!r} does not exist yet and this broker user may not "
                                     "create it; the gateway or deploy/rabbitmq/setup-users.sh creates it") from None
            finally:
                with suppress(Exception):  # a channel the broker closed already
                    channel.close()  # type: ignore[attr-defined]


def publish_json(producer: Producer, body: bytes, exchange: Exchange, key: str, **properties: Any) -> None:
    """Publish a JSON message once (no kombu retry: the caller handles a failure) with ``properties``."""
    producer.publish(body, exchange=exchange, routing_key=key, content_type="application/json",
                     content_encoding="utf-8", retry=False, **properties)


def backoff(attempt: int, max_delay: float) -> float:
    """Bounded exponential backoff: 0.1, 0.2, 0.4 ... max_delay seconds."""
    return min(max_delay, 0.1 * (2 ** min(attempt, 10)))


def safe_release(conn: Connection | None) -> None:
    """Close ``conn`` with the broker (its channels, then the connection): waits for the broker's answers."""
    if conn is not None:
        with suppress(Exception):  # the connection is being thrown away
            conn.release()


def drop(conn: Connection | None) -> None:
    """Throw ``conn`` away without a word to the broker (kombu's ``collect``: the socket is closed, nothing is
    sent or awaited): for a connection that broke, or whose broker stopped answering."""
    if conn is not None:
        with suppress(Exception):  # the connection is being thrown away
            conn.collect()


# --- a bus thread's wait on its broker socket -------------------------------------------------------------

def buffered(sock: object) -> int:
    """Bytes a TLS socket has decrypted and not handed out yet (``SSLSocket.pending``): invisible to
    ``select`` and the event loop. A plain TCP socket keeps none (py-amqp reads exactly what a frame needs)."""
    pending = getattr(sock, "pending", None)
    return pending() if pending is not None else 0


class Wakeup:
    """The one select loop of a bus thread: it waits on its broker socket and on a pipe that other threads
    write to (:meth:`wake`) when they hand it work. A wake-up already pending is not written again: under load
    the thread finds many hand-overs per wake-up, and the callers make no system call for the others."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._pending = False  # a wake-up is written and not read yet

    def wake(self) -> None:
        if self._pending or self._w < 0:
            return  # the thread will look at its work anyway; or closed: it has stopped
        self._pending = True
        with suppress(OSError):  # the pipe is full: the thread has wake-ups to read
            os.write(self._w, b"\0")

    def wait(self, sock: socket.socket | None, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the broker (``sock``; None: no connection) or a wake-up; whether
        the broker's socket has something to read."""
        if sock is not None and buffered(sock):
            return True
        readable = select.select([self._r] if sock is None else [sock, self._r], [], [], timeout)[0]
        if self._r in readable:
            with suppress(BlockingIOError):
                while os.read(self._r, 4096):
                    pass
            # after reading: a hand-over from now on writes again; one made while reading was handed over before
            # its wake-up, and the caller runs the work it finds after this wait
            self._pending = False
        return sock is not None and sock in readable

    def close(self) -> None:
        fds, self._r, self._w = (self._r, self._w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def read_messages(conn: Connection, sock: socket.socket, timeout: float = 0.05) -> None:
    """Read the messages that have come; each read waits at most ``timeout`` seconds for the rest of a message's
    frames (a partial frame is kept for the next read).

    The socket has ``timeout`` for the whole block of reads: py-amqp then finds the timeout it wants already set
    and leaves it (it sets and restores it around every frame otherwise: two system calls each)."""
    before = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        while True:
            try:
                conn.drain_events(timeout=timeout)
            except socket.timeout:
                return
            if not (buffered(sock) or select.select([sock], [], [], 0)[0]):
                return
    finally:
        with suppress(OSError):  # closed meanwhile: the connection is being replaced
            sock.settimeout(before)
