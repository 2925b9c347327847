"""A broker frozen (SIGSTOP) for longer than the request deadline, under load, on a private node.

The broker's TCP connections stay open and nothing comes back, the case a stopped or killed broker never shows.
Required: every scheduling call gets its reply (a result, or the fallback with an error) by its deadline,
``/healthz`` answers within 1 s all along, ``/readyz`` says the bus is down, and once the broker runs again
the gateway is ready again and answers with results.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import xmlrpc.client
from pathlib import Path

import httpx
import pytest

from tests.support.net import free_port
from tests.support.stack import AUTH, SCORING_QUEUES, Proc, Stack, bus_args, plugin_copy
from tests.support.waiting import wait_until
from tests.support.engine_wire import call
from tests.support.rabbit_private import PrivateRabbit, available

pytestmark = [pytest.mark.rabbitmq, pytest.mark.skipif(available() is not None, reason=str(available()))]

H = [f"bbbbbbbb-0000-0000-0000-00000000000{i}" for i in range(4)]
VM = "11111111-2222-3333-4444-555555555555"
DEADLINE = 2.0  # the gateway's --request-timeout, seconds
FROZEN = 3 * DEADLINE  # how long the broker is stopped
CLIENTS = 4
SLACK = 2.5  # a reply's lateness past its deadline allowed on a loaded 2-core machine, seconds


class Load:
    """Engine-like clients calling runFilters over and over (a new connection each); every call is recorded."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.calls: list[tuple[float, float, str]] = []  # (started, seconds, "result" | "error" | "no reply: ...")
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(DEADLINE + 30)

    def _client(self) -> None:
        body = call("runFilters", ["KeepEven"], H, VM, {})
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                r = httpx.post(f"http://127.0.0.1:{self.port}/", content=body, headers={"Content-Type": "text/xml"},
                               timeout=DEADLINE + 20)
                (reply,), _ = xmlrpc.client.loads(r.content)
                kind = "result" if reply["result_code"] == 0 and reply["result"] == [H[0], H[2]] else "error"
            except Exception as exc:  # noqa: BLE001 - recorded, and the test fails on it
                kind = f"no reply: {type(exc).__name__}: {exc}"
            self.calls.append((started, time.monotonic() - started, kind))

    def since(self, t: float) -> list[tuple[float, float, str]]:
        """The calls in flight at ``t`` or started after it."""
        return [c for c in self.calls if c[0] + c[1] >= t]


def _probe(url: str) -> tuple[float, httpx.Response | None]:
    started = time.monotonic()
    try:
        r = httpx.get(url, headers=AUTH, timeout=10)
    except httpx.HTTPError:
        r = None
    return time.monotonic() - started, r


def test_a_frozen_broker_never_freezes_the_gateway(tmp_path: Path):
    node = PrivateRabbit.start_new(tmp_path / "node")
    plugins = plugin_copy(tmp_path)
    port = free_port()
    bus = bus_args(tmp_path, node.url())
    procs = [Proc([name, *bus, "--plugins", str(plugins), "--pool-size", "2"], tmp_path / f"{name}.log").start()
             for name in ("discovery", "scoring")]
    procs.append(Proc(["gateway", *bus, "--port", str(port), "--request-timeout", str(DEADLINE),
                       "--connect-timeout", "1"], tmp_path / "gateway.log").start())
    stack = Stack(port, plugins, procs)
    frozen = False
    try:
        stack.wait_ready(90, queues=SCORING_QUEUES)
        with Load(port) as load:
            wait_until(lambda: len(load.calls) >= 20, 30, 0.05, "calls answered before the freeze")
            assert all(kind == "result" for _, _, kind in load.calls)
            os.killpg(node.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            frozen, frozen_at = True, time.monotonic()
            health, readiness, down = [], [], None
            while time.monotonic() - frozen_at < FROZEN:
                health.append(_probe(stack.url + "/healthz"))
                seconds, ready = _probe(stack.url + "/readyz")
                readiness.append((seconds, ready))
                if down is None and ready is not None and ready.status_code == 503 and ready.json()["bus"] != "connected":
                    down = time.monotonic() - frozen_at
                time.sleep(0.2)
            os.killpg(node.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            frozen = False
            during = load.since(frozen_at)
            stack.wait_ready(60, queues=SCORING_QUEUES)
            resumed = time.monotonic()
            wait_until(lambda: any(kind == "result" for _, _, kind in load.since(resumed)), 30, 0.1,
                       "results again once the broker runs")
        late = [(round(s, 2), kind) for started, s, kind in during if s > DEADLINE + SLACK or kind.startswith("no reply")]
        assert not late, f"calls answered late or not at all while the broker was frozen: {late}"
        assert any(kind == "error" for _, _, kind in during), "the freeze was not felt"
        slow = [(round(s, 2), r and r.status_code) for s, r in health if r is None or s > 1.0 or r.status_code != 200]
        assert not slow, f"/healthz slow or failing during the freeze: {slow}"
        # /readyz pings every queue for up to 1 s while the bus still looks connected
        slow = [(round(s, 2), r and r.status_code) for s, r in readiness if r is None or s > 1.0 + SLACK]
        assert not slow, f"/readyz slow or unanswered during the freeze: {slow}"
        assert down is not None, "/readyz never said the bus was down"
        print(f"\n{len(during)} calls during the freeze, none late; /readyz said the bus was down after {down:.1f} s; "
              f"slowest /healthz {max(s for s, _ in health):.2f} s")
    finally:
        if frozen:
            os.killpg(node.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        stack.stop()
        node.stop()
