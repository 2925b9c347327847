"""Read timeouts for uvicorn's httptools protocol: headers and body must arrive in time.

uvicorn closes idle keep-alive connections but waits forever for a request
that has begun: a client that sends half a request line, or a body byte a
minute, holds a connection (and a file descriptor) as long as it likes.
:class:`ReadTimeouts` arms a timer when a connection opens and when a request
begins, until its headers are complete (``header_timeout``), then until its
body is complete (``body_timeout``). On expiry the connection is closed, with
``408 Request Timeout`` when the client had sent part of a request and no
response is under way (silently when it sent nothing).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("vmsched.gateway")

_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s")


class ReadTimeouts:
    """Mixin for :class:`HttpToolsProtocol`: header and body read timeouts (seconds, class attributes)."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any

    _read_timer: asyncio.TimerHandle | None = None
    _started: bool = False  # a byte of the current request arrived

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._expired, what, seconds)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _expired(self, what: str, seconds: float) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        answering = self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete
        if self._started and not answering:
            body = b'{"detail":{"code":"timeout","error":"request %s not received within %gs"}}' % (
                what.encode(), seconds)
            self.transport.write(_408 % (len(body), body))
        log.info("closed a connection: request %s not received within %g s", what, seconds)
        self.transport.close()

    # --- protocol hooks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._arm(self.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self._started = True
        if self._read_timer is None:  # a keep-alive connection's next request
            self._arm(self.header_timeout, "headers")

    def on_headers_complete(self) -> None:
        self._arm(self.body_timeout, "body")
        super().on_headers_complete()  # type: ignore[misc]

    def on_message_complete(self) -> None:
        self._disarm()
        self._started = False
        super().on_message_complete()  # type: ignore[misc]


def with_read_timeouts(protocol: type[HttpToolsProtocol], header_timeout: float,
                       body_timeout: float) -> type[HttpToolsProtocol]:
    """``protocol`` (uvicorn's httptools protocol or a subclass) with read timeouts, for ``uvicorn.Config(http=...)``."""
    return type(f"Timed{protocol.__name__}", (ReadTimeouts, protocol),
                {"header_timeout": header_timeout, "body_timeout": body_timeout})
