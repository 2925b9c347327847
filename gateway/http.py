"""The gateway's HTTP protocol: uvicorn's httptools protocol with read timeouts and the client certificate.

**Read timeouts.** uvicorn closes idle keep-alive connections but waits forever for a request that has
begun: a client that sends half a request line, or a body byte a minute, holds a connection (and a file
descriptor) as long as it likes. :class:`GatewayHttp` arms a timer when a connection opens and when a
request begins, until its headers are complete (``header_timeout``), then until its body is complete
(``body_timeout``). On expiry the connection is closed, with ``408 Request Timeout`` when the client had
sent part of a request and no response is under way (silently when it sent nothing).

**The client certificate.** uvicorn does not put the peer certificate in the ASGI scope; this protocol puts
a verified certificate's subject (``--tls-client-ca``) in ``scope["extensions"]["tls"]["client_cert_name"]``
(the ASGI TLS extension), in RFC 4514 form, most specific attribute first (``CN=engine-1,O=Example``), as
``openssl x509 -noout -subject -nameopt RFC2253`` prints it.

The one place vmsched relies on a dependency's unexported class: uvicorn offers no public option for header
and body read timeouts, and an ASGI middleware runs only after the headers are read. What it relies on
(the protocol's hooks and ``cycle.response_started``/``response_complete``) is listed in
:data:`UVICORN_SURFACE`; uvicorn's version range is pinned in pyproject.toml, and
tests/gateway/test_http_timeouts.py fails when uvicorn changes it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("vmsched.gateway")

#: What GatewayHttp relies on in uvicorn's HttpToolsProtocol: the hooks it extends and the cycle's flags it reads.
UVICORN_SURFACE = {
    "hooks": ("connection_made", "connection_lost", "on_message_begin", "on_headers_complete",
              "on_message_complete"),
    "attributes": ("transport", "loop", "cycle", "scope"),
    "cycle": ("response_started", "response_complete"),
}

_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s")

_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
          "stateOrProvinceName": "ST", "localityName": "L", "domainComponent": "DC", "userId": "UID",
          "streetAddress": "STREET"}


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out[:1] in ("#", " "):
        out = "\\" + out
    if out.endswith(" "):
        out = out[:-1] + "\\ "
    return out


def subject_name(cert: dict[str, Any] | None) -> str | None:
    """RFC 4514 text of ``ssl.getpeercert()``'s subject, None without a verified certificate."""
    if not cert or not cert.get("subject"):
        return None
    rdns = ("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn) for rdn in reversed(cert["subject"]))
    return ",".join(rdns)


class GatewayHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body read timeouts (seconds) and the client certificate."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any
    scope: dict[str, Any]

    read_timer: asyncio.TimerHandle | None = None
    request_begun: bool = False  # a byte of the current request arrived
    client_cert_name: str | None = None

    def arm(self, seconds: float, what: str) -> None:
        self.disarm()
        self.read_timer = self.loop.call_later(seconds, self.expired, what, seconds)

    def disarm(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def expired(self, what: str, seconds: float) -> None:
        self.read_timer = None
        if self.transport.is_closing():
            return
        answering = self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete
        if self.request_begun and not answering:
            body = b'{"detail":{"code":"timeout","error":"request %s not received within %gs"}}' % (
                what.encode(), seconds)
            self.transport.write(_408 % (len(body), body))
        log.info("closed a connection: request %s not received within %g s", what, seconds)
        self.transport.close()

    # --- protocol hooks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self.client_cert_name = subject_name(transport.get_extra_info("peercert"))
        self.arm(self.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.client_cert_name:
            self.scope["extensions"] = {"tls": {"client_cert_name": self.client_cert_name}}
        self.request_begun = True
        if self.read_timer is None:  # a keep-alive connection's next request
            self.arm(self.header_timeout, "headers")

    def on_headers_complete(self) -> None:
        self.arm(self.body_timeout, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.disarm()
        self.request_begun = False
        super().on_message_complete()


def gateway_http(header_timeout: float, body_timeout: float) -> type[GatewayHttp]:
    """The gateway's protocol with these read timeouts, for ``uvicorn.Config(http=...)``."""
    return type("GatewayHttp", (GatewayHttp,), {"header_timeout": header_timeout, "body_timeout": body_timeout})
