"""The bus's socket I/O helpers: buffered reads (vmsched.bus.reads) and corked writes (vmsched.bus.cork)."""

from __future__ import annotations

import socket
import struct

import pytest
from amqp.transport import TCPTransport

from vmsched.bus.cork import corked
from vmsched.bus.reads import ChunkedRecv, buffer_reads, nonblocking


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, 1, len(payload)) + payload + b"\xce"


def test_chunked_recv_serves_small_reads_from_one_receive() -> None:
    a, b = socket.socketpair()
    with a, b:
        calls: list[int] = []

        class Counting:
            def recv(self, n: int) -> bytes:
                calls.append(n)
                return b.recv(n)

        reader = ChunkedRecv(Counting(), size=64)  # type: ignore[arg-type]
        a.sendall(b"0123456789" * 10)  # 100 bytes, chunks of 64
        got = [reader(7), reader(50), reader(1)]
        assert got == [b"0123456", b"7890123456789012345678901234567890123456789012345678"[:50], b"7"]
        assert len(calls) == 1 and reader.pending() == 64 - 58
        rest = reader(100)  # what the chunk still holds, not more: recv returns up to n
        assert rest == b"890123" and reader.pending() == 0
        assert reader(100) == (b"0123456789" * 10)[64:]
        assert len(calls) == 2


def test_chunked_recv_keeps_the_sockets_timeouts_and_end() -> None:
    a, b = socket.socketpair()
    with a, b:
        reader = ChunkedRecv(b, size=16)
        b.settimeout(0)
        with pytest.raises(BlockingIOError):
            reader(7)
        a.sendall(b"abc")
        assert reader(7) == b"abc"
        a.close()
        assert reader(7) == b""  # the peer closed


def test_py_amqp_reads_frames_through_the_buffer() -> None:
    a, b = socket.socketpair()
    with a, b:
        transport = TCPTransport.__new__(TCPTransport)
        transport.sock = b
        transport._setup_transport()
        transport.raise_on_initial_eintr = True
        pending = buffer_reads(transport)
        frames = [_frame(1, b"method"), _frame(2, b"header"), _frame(3, b"x" * 300)]
        a.sendall(b"".join(frames))
        assert transport.read_frame() == (1, 1, b"method")
        assert pending() == len(frames[1]) + len(frames[2])
        assert transport.read_frame() == (2, 1, b"header")
        assert transport.read_frame() == (3, 1, b"x" * 300)
        assert pending() == 0


def test_buffer_reads_leaves_other_transports_alone() -> None:
    class Other:
        sock = None

    assert buffer_reads(Other())() == 0
    assert buffer_reads(object())() == 0


class _Transport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self._write = self.sent.append

    def write(self, data: bytes) -> None:
        self._write(data)


class _Channel:
    def __init__(self) -> None:
        self.connection = type("C", (), {})()
        self.connection.transport = _Transport()


def test_corked_frames_leave_in_one_write_in_order() -> None:
    channel = _Channel()
    transport = channel.connection.transport
    buf = bytearray(b"reply")
    with corked(channel):
        transport.write(memoryview(buf))  # py-amqp writes a view of a buffer it reuses
        buf[:] = b"ack!!"
        transport.write(memoryview(buf))
        assert transport.sent == []
    assert transport.sent == [b"replyack!!"]
    transport.write(b"later")  # uncorked again
    assert transport.sent == [b"replyack!!", b"later"]


def test_corked_still_sends_what_was_written_when_the_block_fails() -> None:
    channel = _Channel()
    transport = channel.connection.transport
    with pytest.raises(RuntimeError):
        with corked(channel):
            transport.write(b"first")
            raise RuntimeError("second publish failed")
    assert transport.sent == [b"first"]


def test_corked_without_a_py_amqp_transport_does_nothing() -> None:
    with corked(object()):
        pass


def test_nonblocking_sets_the_timeout_once_and_restores_it() -> None:
    a, b = socket.socketpair()
    with a, b:
        transport = type("T", (), {"sock": b})()
        b.settimeout(None)
        with nonblocking(transport):
            assert b.gettimeout() == 0.0
            with pytest.raises(BlockingIOError):
                b.recv(1)
        assert b.gettimeout() is None
        with pytest.raises(RuntimeError):
            with nonblocking(transport):
                raise RuntimeError("a read failed")
        assert b.gettimeout() is None
    with nonblocking(object()):
        pass


class _CountingSocket(socket.socket):
    settimeouts = 0

    def settimeout(self, value: float | None) -> None:
        type(self).settimeouts += 1
        super().settimeout(value)


def test_a_message_read_with_the_timeout_set_once() -> None:
    """The service worker reads a message's three frames with py-amqp's 0.05 s timeout: set once, not per frame."""
    a, raw = socket.socketpair()
    b = _CountingSocket(fileno=raw.detach())
    with a, b:
        transport = TCPTransport.__new__(TCPTransport)
        transport.sock = b
        transport._setup_transport()
        transport.raise_on_initial_eintr = True
        buffer_reads(transport)
        a.sendall(b"".join([_frame(1, b"method"), _frame(2, b"header"), _frame(3, b"body")]))

        def read_message() -> list[bytes]:
            frames = []
            for _ in range(3):
                with transport.having_timeout(0.05):  # what py-amqp's drain_events does for each frame
                    frames.append(transport.read_frame()[2])
            return frames

        _CountingSocket.settimeouts = 0
        with nonblocking(transport, 0.05):
            assert read_message() == [b"method", b"header", b"body"]
            assert b.gettimeout() == 0.05
        assert b.gettimeout() is None
        assert _CountingSocket.settimeouts == 2  # set and restored once
        a.sendall(b"".join([_frame(1, b"method"), _frame(2, b"header"), _frame(3, b"body")]))
        _CountingSocket.settimeouts = 0
        read_message()
        assert _CountingSocket.settimeouts == 6  # without: py-amqp's set and restore around each frame
