"""Bus options, and opening kombu connections to RabbitMQ, and the errors that mean "the broker went away"."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable
from urllib.parse import urlsplit

import amqp.connection
import amqp.exceptions
from kombu import Connection, Exchange
from kombu.transport import pyamqp

from vmsched.bus import BusUnavailable
from vmsched.bus.topology import DELIVERY_LIMIT
from vmsched.bus.urls import mask, split

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


@dataclass(frozen=True)
class BusOptions:
    url: str = field(repr=False)  # may hold a password: shown only through `where`; `a;b;c`: a cluster's nodes
    connect_timeout: float = 2.0
    confirm_timeout: float = 2.0
    heartbeat: int = 10
    reconnect_max_delay: float = 5.0
    confirms: bool = True  # publisher confirms (RabbitMQ); replies go without
    ca: Path | None = None  # amqps: CA bundle that signed the broker's certificate (default: the system's)
    cert: Path | None = None  # amqps: client certificate chain (optional)
    key: Path | None = None  # amqps: its private key
    delivery_limit: int = DELIVERY_LIMIT  # deliveries of a scheduling request at most (topology.request_queue)

    def __post_init__(self) -> None:
        schemes = {url.split("://", 1)[0] for url in self.urls}
        if not schemes:
            raise ValueError("no broker URL given")
        if len(self.urls) > 1 and ("memory" in schemes or "amqps" in schemes and len(schemes) > 1):
            raise ValueError(f"the broker URLs of a cluster must all be amqp:// or all amqps://: {self.where}")
        tls_files = [f for f in (self.ca, self.cert, self.key) if f is not None]
        if tls_files and not self.tls:
            raise ValueError(f"--amqp-ca/--amqp-cert/--amqp-key need an amqps:// broker URL, not {self.where}")
        if (self.cert is None) != (self.key is None):
            raise ValueError("--amqp-cert and --amqp-key go together (the client certificate and its private key)")
        for path in tls_files:
            if not Path(path).is_file():
                raise ValueError(f"broker TLS file {path} does not exist")

    def without_confirms(self) -> "BusOptions":
        return replace(self, confirms=False)

    @property
    def urls(self) -> tuple[str, ...]:
        """The broker's nodes, in order of preference (one URL, or kombu's failover list ``a;b;c``)."""
        return tuple(split(self.url))

    @property
    def embedded(self) -> bool:
        """``memory://``: the in-process bus (vmsched.bus.inprocess), no broker."""
        return self.url.startswith("memory://")

    @property
    def tls(self) -> bool:
        return self.url.startswith("amqps://")

    @property
    def where(self) -> str:
        """The URL without its password, for logs and messages."""
        return mask(self.url)

    def ssl_options(self, url: str | None = None) -> dict[str, object] | None:
        """py-amqp TLS options for ``url`` (default: the first node): the broker's certificate verified, its host
        name checked."""
        if not self.tls:
            return None
        hostname = urlsplit(url or self.urls[0]).hostname
        opts: dict[str, object] = {"cert_reqs": ssl.CERT_REQUIRED, "server_hostname": hostname,
                                   "tls_minimum_version": ssl.TLSVersion.TLSv1_2}
        if self.ca is not None:
            opts["ca_certs"] = str(self.ca)
        if self.cert is not None:
            opts["certfile"], opts["keyfile"] = str(self.cert), str(self.key)
        return opts

    @classmethod
    def from_settings(cls, settings: object) -> "BusOptions":
        return cls(
            url=settings.amqp_url,  # type: ignore[attr-defined]
            connect_timeout=settings.connect_timeout,  # type: ignore[attr-defined]
            confirm_timeout=settings.confirm_timeout,  # type: ignore[attr-defined]
            reconnect_max_delay=settings.reconnect_max_delay,  # type: ignore[attr-defined]
            ca=getattr(settings, "amqp_ca", None),
            cert=getattr(settings, "amqp_cert", None),
            key=getattr(settings, "amqp_key", None),
            delivery_limit=getattr(settings, "delivery_limit", DELIVERY_LIMIT),
        )


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
