"""Buffered reads for py-amqp's TCP transport: one ``recv`` for what has arrived, not three per frame.

py-amqp reads a frame with three ``recv`` calls (its 7-byte header, its payload, its end octet),
so a delivered message (method, header and body frames) costs nine system calls, plus the one
that finds the socket empty. :class:`ChunkedRecv` replaces the transport's receive function: it
takes up to 64 KiB the socket has ready in one call and serves py-amqp's small reads from it.
Timeouts and errors are the socket's own: a read finds the socket only when nothing is buffered.

Bytes kept here are invisible to ``select`` and the event loop: a reader that waits for the socket
to be readable first asks :meth:`ChunkedRecv.pending` (the AMQP bus client drains until the
socket is empty, so nothing stays behind; the service worker checks ``pending`` before waiting).
TLS transports are left alone (the SSL object buffers already: ``SSLSocket.pending``).
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Callable, Iterator

from amqp.transport import TCPTransport

CHUNK = 65536


class ChunkedRecv:
    def __init__(self, sock: socket.socket, size: int = CHUNK) -> None:
        self._recv = sock.recv
        self._size = size
        self._data = b""
        self._at = 0

    def __call__(self, n: int) -> bytes:
        data, at = self._data, self._at
        if at >= len(data):
            got = self._recv(max(n, self._size))  # the socket's timeout and errors, as before
            if len(got) <= n:
                return got  # also b"": the peer closed
            data, at = self._data, self._at = got, 0
        end = min(at + n, len(data))
        self._at = end
        return data[at:end] if at or end < len(data) else data

    def pending(self) -> int:
        """Bytes received and not read yet."""
        return len(self._data) - self._at


def nothing_buffered() -> int:
    """What :func:`buffer_reads` returns where nothing is buffered."""
    return 0


def buffer_reads(transport: object) -> Callable[[], int]:
    """Install a :class:`ChunkedRecv` on a py-amqp TCP transport; returns how many bytes it holds (a
    function, always 0 when nothing was installed: TLS, the embedded bus)."""
    sock = getattr(transport, "sock", None)
    pending: Callable[[], int] = getattr(sock, "pending", None) or (lambda: 0)  # TLS: decrypted bytes
    if not isinstance(transport, TCPTransport) or sock is None:
        return pending
    reader = ChunkedRecv(sock)
    transport._quick_recv = reader  # py-amqp's _read calls it for every piece of a frame
    return reader.pending


@contextmanager
def nonblocking(transport: object, timeout: float = 0.0) -> Iterator[None]:
    """The transport's socket with ``timeout`` (default none: non-blocking) for a block of reads with that
    same timeout: py-amqp sets and restores the socket's timeout around every frame it reads (two system
    calls each, six for a message), here once for the block."""
    sock = getattr(transport, "sock", None)
    if sock is None or not hasattr(sock, "settimeout"):
        yield
        return
    before = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        yield
    finally:
        try:
            sock.settimeout(before)
        except OSError:
            pass  # closed meanwhile: the connection is being replaced
