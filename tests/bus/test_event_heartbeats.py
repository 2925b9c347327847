"""An idle event publisher keeps its connection: it heartbeats, so the broker does not close it.

On a private vhost of the shared broker, with a 3 s heartbeat: a publisher that sent one event and then
nothing for four heartbeat intervals (RabbitMQ closes a connection that sends no heartbeat after about
three) still has the same connection, as the broker lists it, and its next event goes out on it.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from kombu import Connection, Consumer, Queue

from tests.support.rabbit import RABBIT_URL, private_vhost
from tests.support.waiting import wait_until
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.connection import ensure_exchanges
from vmsched.bus.rabbitmq.events import EventPublisher
from vmsched.bus.topology import EVENTS_EXCHANGE

pytestmark = pytest.mark.rabbitmq

HEARTBEAT = 3  # seconds, asked by the publisher; the broker's default is longer, so this one is used
IDLE = 4 * HEARTBEAT


def connections(vhost: str) -> dict[str, int]:
    """The broker's connections on ``vhost``: name (client and server address) -> negotiated heartbeat."""
    out = subprocess.run(["rabbitmqctl", "-q", "list_connections", "name", "vhost", "timeout", "--formatter", "json"],
                         check=True, capture_output=True, text=True, timeout=60)
    return {c["name"]: c["timeout"] for c in json.loads(out.stdout) if c["vhost"] == vhost}


def _with_one_more(listed: dict[str, int], before: dict[str, int]) -> dict[str, int] | None:
    return listed if len(listed) == len(before) + 1 and before.keys() <= listed.keys() else None


def test_an_idle_event_publisher_heartbeats_and_keeps_its_connection() -> None:
    with private_vhost("vmsched-test-heartbeat") as vhost:
        got: list[dict] = []
        # the test's own reader: no heartbeat asked (kombu's default), so the broker keeps it while it idles
        with Connection(RABBIT_URL + vhost) as reader:
            ensure_exchanges(reader, (EVENTS_EXCHANGE,))
            queue = Queue("events", exchange=EVENTS_EXCHANGE, routing_key="test.#", exclusive=True)(reader.channel())
            queue.declare()
            Consumer(queue.channel, [queue], callbacks=[lambda body, message: got.append(body)],
                     accept=["json"]).consume()
            mine = wait_until(lambda: connections(vhost), 30, 0.2, "the reader's connection")
            publisher = EventPublisher(BusOptions(url=RABBIT_URL + vhost, heartbeat=HEARTBEAT), "test")
            try:
                assert publisher.publish("test.first", {"n": 1})
                listed = wait_until(lambda: _with_one_more(connections(vhost), mine), 30, 0.2,
                                    "the publisher's connection")
                [(name, heartbeat)] = [(n, t) for n, t in listed.items() if n not in mine]
                assert heartbeat == HEARTBEAT  # the broker expects a frame from it every 3 s

                time.sleep(IDLE)  # idle: without heartbeats the broker closes it after about 3 intervals
                assert connections(vhost) == listed, "the broker closed the idle publisher's connection"
                assert publisher.publish("test.second", {"n": 2})
                wait_until(lambda: reader.drain_events(timeout=0.2) or len(got) == 2, 10, 0, "both events",
                           retry_on=(TimeoutError,))
                assert [body["n"] for body in got] == [1, 2]
                assert connections(vhost) == listed, "the second event needed another connection"
            finally:
                publisher.close()
