"""Where the bus is and how to reach it: :class:`BusOptions`, and broker URLs: where a password may come
from, and how a URL is shown.

A broker may be a cluster: several URLs, separated by ``;`` as in kombu's
failover syntax (``amqp://u:p@node1:5672/vmsched;amqp://u:p@node2:5672/vmsched``),
or one a line in the URL file. A component connects to the first node that
answers and, when that node goes away, to another one
(docs/deploy/rabbitmq-cluster.md).

A password never comes from the command line (``ps`` shows every process's
arguments to every user): it comes from a file (``--amqp-url-file``) or the
environment (``VMSCHED_AMQP_URL``). A URL is only ever shown masked
(``amqp://user:***@host:5672/vhost``), in logs and in error messages.
"""

from __future__ import annotations

import argparse
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from vmsched.bus.topology import DELIVERY_LIMIT

#: ``scheme://user:password@`` anywhere in a text (several URLs, or one inside an error message).
_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<password>[^@\s]*)@")

ALTERNATIVES = "put the URL in a file readable only by the service (--amqp-url-file FILE, env VMSCHED_AMQP_URL_FILE) " \
               "or in the environment (VMSCHED_AMQP_URL)"


def mask(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def split(text: str) -> list[str]:
    """The URLs of a failover list (``;`` between them), blanks dropped."""
    return [part.strip() for part in text.split(";") if part.strip()]


def has_password(url: str) -> bool:
    """Whether ``url`` (or any URL of a failover list) holds a password."""
    for part in split(url) or [url]:
        try:
            if urlsplit(part).password:
                return True
        except ValueError:
            if _CREDENTIALS.search(part):
                return True
    return False


def url_argument(value: str) -> str:
    """argparse ``type`` of ``--amqp``: a URL without a password; its error (an ArgumentTypeError, which argparse
    shows as it is) shows the value masked."""
    if has_password(value):
        raise argparse.ArgumentTypeError(f"--amqp {mask(value)}: a password on the command line is visible to every "
                                         f"user (ps); {ALTERNATIVES}")
    return value


def read_url_file(path: Path | str) -> str:
    """The broker URL kept in ``path``: its non-empty, non-comment lines, several of them (a cluster's nodes)
    joined into one failover list (``;``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the broker URL file {path}: {exc.strerror or exc}") from None
    urls: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            for url in split(line):
                if "://" not in url:
                    raise ValueError(f"broker URL file {path} does not hold a URL "
                                     "(amqp://USER:PASSWORD@HOST:PORT/VHOST, one a line for a cluster)")
                urls.append(url)
    if not urls:
        raise ValueError(f"broker URL file {path} is empty (expected amqp://USER:PASSWORD@HOST:PORT/VHOST)")
    return ";".join(urls)


@dataclass(frozen=True)
class BusOptions:
    url: str = field(repr=False)  # may hold a password: shown only through `where`; `a;b;c`: a cluster's nodes
    connect_timeout: float = 2.0
    confirm_timeout: float = 2.0
    heartbeat: int = 10
    reconnect_max_delay: float = 2.0  # a broker back is found within 2 s (a logout shared within 5 s)
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
