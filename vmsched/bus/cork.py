"""Several AMQP frames in one socket write: a reply and its ack leave together.

py-amqp writes every method to the socket at once (a ``sendall`` each). A service's bus thread
sends, for each finished request, the reply and then the ack: corked, they go out in one write
(one system call, one segment for the broker to read) in the same order.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def corked(channel: object) -> Iterator[None]:
    """Within the block, frames written on ``channel``'s connection are kept, then written at once on exit
    (also when the block raises: what it wrote before still goes out). Not for a block that waits for an
    answer of the broker (a synchronous method): nothing leaves until the block ends."""
    transport = getattr(getattr(channel, "connection", None), "transport", None)
    if transport is None or not hasattr(transport, "_write"):
        yield  # not py-amqp (the embedded bus): nothing to gather
        return
    own = "_write" in vars(transport)  # TCP: the socket's sendall, set per transport; TLS: a method of the class
    send = transport._write
    frames: list[bytes] = []
    transport._write = lambda data: frames.append(bytes(data))  # a copy: py-amqp reuses its frame buffer
    try:
        yield
    finally:
        if own:
            transport._write = send
        else:
            del transport._write
        if frames:
            transport.write(b"".join(frames))  # py-amqp's write: a failure marks the transport disconnected
