"""Header and body read timeouts: half-open connections are closed; others are served meanwhile.

A real ``vmsched run`` with short timeouts; real sockets that send half a
request line, headers without their end, or half a body. The bound checked
is generous (5x the timeout): the test shows the connections are closed by
the server, not how fast.
"""

from __future__ import annotations

import socket
import time
from typing import Iterator

import pytest

from tests.support.stack import TEST_TOKEN, Stack, start_all_in_one

HEADER_TIMEOUT, BODY_TIMEOUT = 1.0, 1.5
N = 200


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_all_in_one(tmp_path_factory.mktemp("timeouts"), "memory://",
                         "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT))
    yield s
    s.stop()


def _open(stack: Stack, n: int, payload: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", stack.port), timeout=10)
        if payload:
            s.sendall(payload)
        socks.append(s)
    return socks


def _wait_closed(socks: list[socket.socket], bound: float) -> tuple[float, list[bytes]]:
    """Read every socket until the server closes it (EOF or reset); return the time taken and what each got."""
    started = time.monotonic()
    got: list[bytes] = []
    for s in socks:
        s.settimeout(max(0.01, bound - (time.monotonic() - started)))
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError(f"a half-open connection was still open after {bound} s") from None
        finally:
            s.close()
        got.append(data)
    return time.monotonic() - started, got


@pytest.mark.parametrize("payload, timeout, answer", [
    (b"", HEADER_TIMEOUT, b""),  # connected, sent nothing: closed silently
    (b"POST /v1/fil", HEADER_TIMEOUT, b"408 Request Timeout"),  # half a request line
    (b"POST /v1/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", HEADER_TIMEOUT,
     b"408 Request Timeout"),  # headers without their end
    (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n<?xml", BODY_TIMEOUT,
     b"408 Request Timeout"),  # half a body (XML-RPC)
])
def test_half_open_connections_are_closed(timed: Stack, payload: bytes, timeout: float, answer: bytes):
    socks = _open(timed, N, payload)
    # meanwhile, a normal request is served
    assert timed.xmlrpc("runFilters", ["KeepEven"], ["a", "b"], "vm", {})["result_code"] in (0, 1)
    elapsed, got = _wait_closed(socks, 5 * timeout + 5)
    assert all(answer in g if answer else g == b"" for g in got), {g[:80] for g in got}
    print(f"{N} connections ({payload[:20]!r}) closed by the server within {elapsed:.2f} s of the test's wait "
          f"(timeout {timeout} s)")


def test_a_slow_but_steady_request_within_the_timeout_is_served(timed: Stack):
    body = b'{"units": ["KeepEven"], "hosts": ["a", "b"]}'
    head = (b"POST /v1/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (_token(), len(body)))
    with socket.create_connection(("127.0.0.1", timed.port), timeout=10) as s:
        for part in (head[:10], head[10:], body[:5], body[5:]):
            s.sendall(part)
            time.sleep(HEADER_TIMEOUT / 5)
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_keep_alive_connection_gets_a_fresh_header_timeout_per_request(timed: Stack):
    """The header timer of a later request on a kept-alive connection starts when that request begins."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", timed.port), timeout=10) as s:
        for _ in range(3):
            s.sendall(request)
            assert _response(s).startswith(b"HTTP/1.1 200")
            time.sleep(HEADER_TIMEOUT * 0.6)  # total well past one header timeout; each request in time
        s.sendall(b"GET /heal")
        s.settimeout(5 * HEADER_TIMEOUT + 5)
        assert b"408" in s.recv(4096)


def _response(s: socket.socket) -> bytes:
    """One whole HTTP response (headers and Content-Length body), however the segments arrive."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(4096)
        assert chunk, f"connection closed mid-body: {head!r}"
        body += chunk
    assert len(body) == length, (head, body)
    return head + b"\r\n\r\n" + body


def _token() -> bytes:
    return TEST_TOKEN.encode()


def test_uvicorn_still_offers_what_the_gateway_protocol_extends():
    """gateway/http.py is the one place vmsched extends a dependency's unexported class: it fails here first."""
    import inspect

    from uvicorn.protocols.http import httptools_impl

    from vmsched.gateway.http import UVICORN_SURFACE, GatewayHttp

    protocol = httptools_impl.HttpToolsProtocol
    for hook in UVICORN_SURFACE["hooks"]:
        assert callable(getattr(protocol, hook, None)), f"uvicorn's HttpToolsProtocol has no {hook}"
    init = inspect.getsource(protocol.__init__)
    for name in UVICORN_SURFACE["attributes"]:
        assert f"self.{name} =" in init or f"self.{name}:" in init, f"HttpToolsProtocol no longer sets {name}"
    cycle = inspect.getsource(httptools_impl.RequestResponseCycle.__init__)
    for name in UVICORN_SURFACE["cycle"]:
        assert f"self.{name} =" in cycle, f"uvicorn's RequestResponseCycle no longer sets {name}"
    ours = {n for n in vars(GatewayHttp) if not n.startswith("__")} - set(UVICORN_SURFACE["hooks"])
    assert not ours & set(dir(protocol)), f"GatewayHttp's own names shadow uvicorn's: {ours & set(dir(protocol))}"
