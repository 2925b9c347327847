"""Poison messages (issue 9): a request whose handling kills its service is delivered at most N times,
then dead-lettered and answered with an error naming its units; every other request is answered.

Real processes on a private vhost of the shared RabbitMQ: a gateway and two scoring replicas. The
sandbox stops a plugin from killing its own service, so the death comes from outside, as it does in
a deployment when the kernel's OOM killer picks the service or native code crashes it: a watcher
thread (this test playing the kernel) SIGKILLs the whole replica whose plugin worker is running the
``Poison`` unit, which marks its own thread name while it runs. The test also plays the supervisor
(systemd ``Restart=``, Kubernetes): it restarts each killed replica.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import RABBIT_URL, SERVICE_QUEUES, Proc, Stack, bus_args, free_port, rabbit_up, wait_until
from vmsched.bus.client import AsyncBusClient
from vmsched.bus.connection import BusOptions
from vmsched.bus.topology import REQUEST_QUEUES, dead_letter_queue, legacy_name
from vmsched.messages import FilterReply, Op, request_units

MARK = "vmsched-poison"  # at most 15 bytes: the kernel's thread name
PLUGIN = f'''
import ctypes
import time


class Poison:
    """Marks its thread, then waits: the watcher kills the service handling it (a crash, an OOM kill)."""
    def do_filter(self, hosts, vm, args):
        ctypes.CDLL(None).prctl(15, b"{MARK}", 0, 0, 0)  # PR_SET_NAME
        time.sleep(8)
        return hosts  # reached only if nobody killed the service: the test then fails


class KeepAll:
    """Keeps every host."""
    def do_filter(self, hosts, vm, args):
        return hosts
'''
HOSTS = [str(uuid.UUID(int=i + 1)) for i in range(4)]
VM = str(uuid.UUID(int=99))


@pytest.fixture
def vhost() -> Iterator[str]:
    """A vhost of this test's own: the poisoned queues and their dead letters are seen by nobody else."""
    if not rabbit_up():
        pytest.fail("RabbitMQ is not running on the test broker (scripts/test starts it)")
    name = f"vmsched-poison-{uuid.uuid4().hex[:8]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", name], check=True, capture_output=True)
    subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
                   check=True, capture_output=True)
    yield name
    subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], capture_output=True)


def _ancestors(pid: int) -> Iterator[int]:
    while pid > 1:
        yield pid
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return


class Kernel(threading.Thread):
    """Kills the replica (its whole process group) whose plugin worker runs the marked unit."""

    def __init__(self, replicas: list[Proc]) -> None:
        super().__init__(daemon=True)
        self.replicas = replicas
        self.kills: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/comm", "rb") as f:
                        if f.read().strip() != MARK.encode():
                            continue
                    self._kill_owner(int(entry))
                except OSError:
                    continue  # the process is gone
                except Exception as exc:  # noqa: BLE001 - reported by the test, never a silent dead watcher
                    self.errors.append(repr(exc))

    def _kill_owner(self, worker: int) -> None:
        chain = set(_ancestors(worker))
        for proc in list(self.replicas):
            if proc.popen is not None and proc.popen.pid in chain and proc.popen.poll() is None:
                self.kills.append(proc.popen.pid)
                proc.kill()  # SIGKILL to the replica's process group, reaped
        try:
            os.kill(worker, signal.SIGKILL)  # in case it is in a process group of its own
        except ProcessLookupError:
            pass


def _consumers(vhost: str, queue: str) -> int:
    out = subprocess.run(["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name", "consumers"],
                         check=True, capture_output=True, text=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.split()[:1] == [queue])


def test_a_request_that_kills_its_service_gets_at_most_n_deliveries_then_an_error(tmp_path: Path, vhost: str):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "poison.py").write_text(PLUGIN)
    url = RABBIT_URL + vhost
    port = free_port()
    common = [*bus_args(tmp_path, url), "--delivery-limit", "2"]
    gateway = Proc(["gateway", "--port", str(port), "--request-timeout", "60", *common], tmp_path / "gateway.log",
                   env={"VMSCHED_AMQP_URL": ""}).start()
    replica_args = ["scoring", "--plugins", str(plugins), "--pool-size", "2", "--no-legacy-queues", *common]
    started = 0

    def replica() -> Proc:
        nonlocal started
        started += 1
        return Proc(replica_args, tmp_path / f"scoring-{started}.log", env={"VMSCHED_AMQP_URL": ""}).start()

    replicas = [replica(), replica()]
    stack = Stack(port, plugins, [gateway, *replicas])
    kernel = Kernel(replicas)
    filter_queue = REQUEST_QUEUES[Op.FILTER]
    try:
        stack.wait_ready(queues=SERVICE_QUEUES["scoring"])
        wait_until(lambda: _consumers(vhost, filter_queue) == 4, 60, 0.2, "both replicas consuming (2 threads each)")
        kernel.start()
        with ThreadPoolExecutor(12) as pool:
            poisoned = pool.submit(stack.xmlrpc, "runFilters", ["Poison"], HOSTS, VM, {})
            others = [pool.submit(stack.xmlrpc, "runFilters", ["KeepAll"], HOSTS[: 1 + i % 4], VM, {})
                      for i in range(10)]

            def supervise() -> None:  # a killed replica comes back (systemd Restart=, Kubernetes)
                for i, proc in enumerate(replicas):
                    if proc.popen is not None and proc.popen.poll() is not None:
                        replicas[i] = replica()
                        stack.procs.append(replicas[i])

            while not poisoned.done():
                supervise()
                time.sleep(0.1)
            reply = poisoned.result()
            answers = [f.result() for f in others]
        kernel.stop.set()
        kernel.join(5)
        supervise()  # the last kill may come just before the error reply
        # at most N deliveries, so at most N replicas killed; then one error reply naming the unit. A single
        # death may count twice: the broker can hand the returned request to the dead connection's other
        # consumer channel before it has closed that one too (docs/upgrading.md, "Poison messages")
        assert not kernel.errors and 1 <= len(kernel.kills) <= 2, (kernel.errors, kernel.kills, reply)
        assert reply["result"] == HOSTS  # the engine's fallback: every host, at once
        (error,) = reply["errors"]
        assert "dead-lettered" in error and "units: Poison" in error, error
        # every other request was answered: run (the usual case) or, had it waited behind the poison in a
        # killed replica twice, dead-lettered with its own unit named
        for i, answer in enumerate(answers):
            if answer["errors"]:
                assert "dead-lettered" in answer["errors"][0] and "KeepAll" in answer["errors"][0], answer
            else:
                assert answer["result"] == HOSTS[: 1 + i % 4], answer
        # the replicas serve on: later requests are all run
        wait_until(lambda: _consumers(vhost, filter_queue) == 4, 60, 0.2, "both replicas consuming again")
        for n in range(1, 5):
            assert stack.xmlrpc("runFilters", ["KeepAll"], HOSTS[:n], VM, {}) == {
                "result_code": 0, "result": HOSTS[:n], "plugin_errors": {}, "errors": []}
        assert _consumers(vhost, dead_letter_queue(filter_queue).name) >= 1
        assert any("dead-lettered after 2 deliveries" in p.output() for p in stack.procs)
        print(f"kills {len(kernel.kills)}, others dead-lettered {sum(bool(a['errors']) for a in answers)} of 10")
    finally:
        kernel.stop.set()
        for proc in stack.procs:
            proc.kill()


def test_a_new_service_answers_an_old_gateway_on_the_unversioned_queue(tmp_path: Path, vhost: str):
    """Rolling upgrade (docs/upgrading.md): services first; an old gateway still publishes to vmsched.filter."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "poison.py").write_text(PLUGIN)
    url = RABBIT_URL + vhost
    scoring = Proc(["scoring", "--plugins", str(plugins), "--pool-size", "1", *bus_args(tmp_path, url)],
                   tmp_path / "scoring.log", env={"VMSCHED_AMQP_URL": ""}).start()
    old, new = legacy_name(REQUEST_QUEUES[Op.FILTER]), REQUEST_QUEUES[Op.FILTER]
    assert old == "vmsched.filter" and new == "vmsched.filter.v2"
    body = {"units": ["KeepAll"], "hosts": HOSTS, "vm": VM}

    async def call(queue: str) -> FilterReply:
        client = AsyncBusClient(BusOptions(url=url), declare=(queue,))
        await client.start()
        try:
            return await client.call(queue, "filter", body, 20, FilterReply)
        finally:
            await client.close()

    try:
        wait_until(lambda: _consumers(vhost, old) >= 1 and _consumers(vhost, new) >= 1, 60, 0.2, "both queues consumed")
        for queue in (old, new):
            (outcome,) = asyncio.run(call(queue)).outcomes
            assert outcome.ok and outcome.hosts == HOSTS, (queue, outcome)
        types = subprocess.run(["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name", "type", "durable"],
                               check=True, capture_output=True, text=True).stdout.split()
        assert types[types.index(old) + 1: types.index(old) + 3] == ["classic", "false"]  # as older releases made it
        assert types[types.index(new) + 1: types.index(new) + 3] == ["quorum", "true"]
    finally:
        scoring.kill()


def test_the_units_of_a_request_are_named_whatever_its_operation():
    assert request_units({"units": ["A", "B"], "hosts": []}) == ["A", "B"]  # filter
    assert request_units({"units": [{"name": "S", "factor": 2}]}) == ["S"]  # score
    assert request_units({"unit": "Bal", "hosts": []}) == ["Bal"]  # balance
    assert request_units({}) == [] and request_units({"units": "not a list", "unit": 5}) == []
