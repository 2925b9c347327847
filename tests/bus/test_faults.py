"""Fault tests on the real RabbitMQ: killed workers, a broker that is gone or goes away."""

from __future__ import annotations

import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.locks import broker_faults_alone  # noqa: F401 - an autouse fixture
from tests.support.net import free_port
from tests.support.stack import SCORING_QUEUES, Proc, Stack, bus_args, plugin_copy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq


H = [f"bbbbbbbb-0000-0000-0000-00000000000{i}" for i in range(4)]
VM = "11111111-2222-3333-4444-555555555555"

SLOW_ONCE = '''
import os, time

class SlowOnce:
    """The first call records its service's pid and stalls; later calls answer."""

    def do_filter(self, hosts, vm, args):
        mark = args["mark"]
        if not os.path.exists(mark):
            with open(mark + ".tmp", "w") as f:
                f.write(str(os.getppid()))
            os.rename(mark + ".tmp", mark)
            time.sleep(60)
        return hosts[:2]
'''


def _services(tmp: Path, bus: str, plugins: Path, scoring: int = 2) -> list[Proc]:
    procs = []
    for i, name in enumerate(["discovery"] + ["scoring"] * scoring):
        procs.append(Proc([name, *bus_args(tmp, bus), "--plugins", str(plugins), "--pool-size", "2",
                           "--plugin-write-dirs", str(tmp)],  # SlowOnce's mark, shared by the replicas
                          tmp / f"{name}-{i}.log").start())
    return procs


def _gateway(tmp: Path, bus: str, port: int, timeout: str = "30") -> Proc:
    return Proc(["gateway", *bus_args(tmp, bus), "--port", str(port), "--request-timeout", timeout,
                 "--connect-timeout", "1"], tmp / "gateway.log").start()


def test_worker_killed_mid_request_is_redelivered(tmp_path: Path, rabbit_vhost: str):
    plugins = plugin_copy(tmp_path)
    (plugins / "slow_once.py").write_text(SLOW_ONCE)
    port = free_port()
    services = _services(tmp_path, rabbit_vhost, plugins)
    stack = Stack(port, plugins, [_gateway(tmp_path, rabbit_vhost, port), *services])
    try:
        stack.wait_ready(queues=SCORING_QUEUES)
        mark = tmp_path / "first-call.pid"
        with ThreadPoolExecutor(1) as ex:
            pending = ex.submit(stack.xmlrpc, "runFilters", ["SlowOnce"], H, VM, {"mark": str(mark)})
            wait_until(mark.exists, 20, 0.05, "the first worker to take the request")
            victim_pid = int(mark.read_text())
            victim = next(p for p in services if p.popen and p.popen.pid == victim_pid)
            victim.kill(signal.SIGKILL)
            reply = pending.result(timeout=60)
        assert reply == {"result_code": 0, "result": H[:2], "plugin_errors": {}, "errors": []}
        assert victim.popen is not None and victim.popen.returncode == -signal.SIGKILL
    finally:
        stack.stop()


def test_broker_unreachable_gives_a_prompt_error(tmp_path: Path):
    closed = free_port()  # nothing listens there
    port = free_port()
    gateway = _gateway(tmp_path, f"amqp://guest:guest@127.0.0.1:{closed}//", port, timeout="20")
    stack = Stack(port, tmp_path, [gateway])
    try:
        wait_until(lambda: _answers(stack), 30, 0.1, "the gateway to listen")
        assert stack.get("/readyz").status_code == 503
        started = time.monotonic()
        reply = stack.xmlrpc("runFilters", ["KeepEven"], H, VM, {})
        elapsed = time.monotonic() - started
        assert reply["result"] == H and reply["result_code"] == 1
        assert "BusUnavailable" in reply["errors"][0]
        assert elapsed < 20, "the answer must come before the request deadline, not at it"
        r = stack.post("/v1/balance", json={"unit": "X", "hosts": H})
        assert r.json()["result"] == ["", []] and "BusUnavailable" in r.json()["errors"][0]
        assert stack.get("/v1/units").status_code == 503
    finally:
        stack.stop()


class CuttableProxy:
    """A TCP proxy to the broker whose connections a test can cut and restore."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def cut(self) -> None:
        if self._listener:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_broker_going_away_and_coming_back(tmp_path: Path, rabbit_vhost: str):
    proxy = CuttableProxy(("127.0.0.1", 5672))
    proxy.open()
    vhost = rabbit_vhost.rsplit("/", 1)[1]
    bus = f"amqp://guest:guest@127.0.0.1:{proxy.port}/{vhost}"
    plugins = plugin_copy(tmp_path)
    port = free_port()
    stack = Stack(port, plugins, [_gateway(tmp_path, bus, port, timeout="10"), *_services(tmp_path, bus, plugins, 1)])
    try:
        stack.wait_ready(queues=SCORING_QUEUES)
        assert stack.xmlrpc("runFilters", ["KeepEven"], H, VM, {})["result"] == [H[0], H[2]]
        proxy.cut()
        started = time.monotonic()
        reply = wait_until(lambda: _failed(stack), 15, 0.1, "the gateway to notice the broker is gone")
        assert reply["result"] == H and reply["result_code"] == 1 and reply["errors"]
        assert time.monotonic() - started < 10
        proxy.open()
        stack.wait_ready(30, queues=SCORING_QUEUES)
        assert stack.xmlrpc("runFilters", ["KeepEven"], H, VM, {})["result"] == [H[0], H[2]]
    finally:
        stack.stop()
        proxy.cut()


def _answers(stack: Stack) -> bool:
    try:
        return stack.get("/healthz").status_code == 200
    except Exception:  # noqa: BLE001
        return False


def _failed(stack: Stack) -> dict | None:
    reply = stack.xmlrpc("runFilters", ["KeepEven"], H, VM, {})
    return reply if reply["result_code"] == 1 else None

