"""Requests held by a replica killed for good: the survivor gives them their second chances within their deadlines.

Two scoring replicas on a private vhost; one is SIGKILLed while it holds four requests (two running, two waiting)
and never comes back. The broker returns what it held; the survivor sends each to its second chance (its
dead-letter queue), holds them together, waits for another replica to consume the queue (none comes: one wait for
all, bounded by their deadlines), then runs them one at a time. Every request is answered by its deadline: with
its result, or, for one that can no longer run in time, with an error naming its unit.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.support.rabbit import RABBIT_URL, private_vhost
from tests.support.stack import Proc, bus_args
from tests.support.waiting import wait_until
from vmsched.bus import BusError, RequestError
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.messages import FilterReply, Op

pytestmark = pytest.mark.rabbitmq

PLUGIN = '''
import time


class Slow:
    """Keeps every host, after half a second."""
    def do_filter(self, hosts, vm, args):
        time.sleep(0.5)
        return hosts
'''
HOSTS = [str(uuid.UUID(int=i + 1)) for i in range(3)]
DEADLINE = 8.0
REQUESTS = 8


def _consumers(vhost: str, queue: str) -> int:
    out = subprocess.run(["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name", "consumers"],
                         capture_output=True, text=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.split()[:1] == [queue])


def _replica(tmp_path: Path, plugins: Path, url: str, n: int) -> Proc:
    return Proc(["scoring", "--plugins", str(plugins), "--pool-size", "2", "--consumers", "2", "--prefetch", "4",
                 "--runtime-dir", str(tmp_path / f"run-{n}"), *bus_args(tmp_path, url)], tmp_path / f"scoring-{n}.log",
                env={"VMSCHED_AMQP_URL": ""}).start()


def test_every_request_a_replica_killed_for_good_held_is_answered_by_its_deadline(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "slow.py").write_text(PLUGIN)
    queue = REQUEST_QUEUES[Op.FILTER]
    with private_vhost("vmsched-held") as vhost:
        url = RABBIT_URL + vhost
        doomed, survivor = _replica(tmp_path, plugins, url, 0), _replica(tmp_path, plugins, url, 1)
        try:
            async def scenario() -> list[tuple[float, object]]:
                client = AsyncBusClient(BusOptions(url=url), declare=(queue,), service="held-test")
                await client.start()
                try:
                    # both replicas consume: each takes its share of the requests
                    await asyncio.to_thread(wait_until, lambda: _consumers(vhost, queue) == 2, 60, 0.5,
                                            "both replicas consuming")

                    async def one() -> tuple[float, object]:
                        started = time.monotonic()
                        try:
                            result: object = await client.call(queue, "filter",
                                                               {"units": ["Slow"], "hosts": HOSTS, "vm": "v"},
                                                               DEADLINE, FilterReply)
                        except BusError as exc:
                            result = exc
                        return time.monotonic() - started, result

                    calls = [asyncio.ensure_future(one()) for _ in range(REQUESTS)]
                    await asyncio.sleep(0.3)  # each replica runs two and holds two more
                    doomed.kill()  # for good: nobody restarts it
                    return await asyncio.gather(*calls)
                finally:
                    await client.close()

            answers = asyncio.run(scenario())
        finally:
            doomed.kill()
            survivor.kill()
        log = survivor.output()
        print("\n".join(line for line in log.splitlines() if "vmsched.bus" in line or "WARN" in line))
        print([(round(e, 2), type(r).__name__) for e, r in answers])
        assert log.count("given a second chance") == 4, log[-3000:]  # what the dead replica held, each once
        assert sum(isinstance(r, FilterReply) for _, r in answers) >= REQUESTS - 1, answers  # at most one too late
        for elapsed, result in answers:
            assert elapsed <= DEADLINE + 0.5, (elapsed, result)
            if isinstance(result, FilterReply):
                assert result.outcomes[0].ok and result.outcomes[0].hosts == HOSTS
            else:  # an error reply naming the unit, never a timeout
                assert isinstance(result, RequestError) and "Slow" in str(result), (result, log[-3000:])
