"""The broker socket of a py-amqp connection, through the socket's public API only."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Iterator


def buffered(sock: object) -> int:
    """Bytes a TLS socket has decrypted and not handed out yet (``SSLSocket.pending``): invisible to
    ``select`` and the event loop. A plain TCP socket keeps none (py-amqp reads exactly what a frame needs)."""
    pending = getattr(sock, "pending", None)
    return pending() if pending is not None else 0


@contextmanager
def nonblocking(sock: socket.socket | None, timeout: float = 0.0) -> Iterator[None]:
    """``sock`` with ``timeout`` (default none: non-blocking) for a block of reads with that same timeout:
    py-amqp then finds the timeout it wants already set and leaves it (it sets and restores it around every
    frame otherwise: two system calls each)."""
    if sock is None:
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
