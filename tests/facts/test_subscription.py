"""The facts subscriber takes messages in batches (vmsched/facts/subscription.py, LINGER) and loses none.

On the real RabbitMQ (a private vhost): a lone message is handed over at once, a message arriving just after
another waits for the rest of the linger (one wake-up for both), and a burst arrives whole.
"""

from __future__ import annotations

import time

import pytest
from kombu import Producer

from tests.support.waiting import wait_until
from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection
from vmsched.bus.options import BusOptions
from vmsched.bus.transport import open_transport
from vmsched.facts.subscription import LINGER, FactsSubscriber
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.facts.model import FactsMessage, HostFacts, facts_key

pytestmark = pytest.mark.rabbitmq


WAIT = 0.3
assert LINGER > 0  # batching is on by default


def body(host: str, seq: int) -> bytes:
    return FactsMessage(host_id=host, instance="t", seq=seq, time=time.time(), interval=5.0,
                        host=HostFacts()).model_dump_json().encode()


def test_messages_are_taken_in_batches_and_none_is_lost(rabbit_vhost: str) -> None:
    got: list[tuple[str, float]] = []
    sub = FactsSubscriber(open_transport(BusOptions(url=rabbit_vhost)), "batch-test", lambda raw, key: got.append((key, time.monotonic())))
    sub.linger = WAIT  # LINGER by default; fixed here so that the test measures its effect
    sub.start()
    try:
        assert sub.ready.wait(20)
        conn = open_connection(BusOptions(url=rabbit_vhost))
        ensure_exchanges(conn, (EVENTS_EXCHANGE,))
        producer = Producer(conn.default_channel, auto_declare=False)
        time.sleep(0.5)  # the subscriber's queue is bound once ready is set; let a snapshot request pass
        sent = time.monotonic()
        producer.publish(body("hv-lone", 1), exchange=EVENTS_EXCHANGE, routing_key=facts_key("hv-lone"))
        wait_until(lambda: len(got) == 1, timeout=10, what="the lone message")
        assert got[0][0] == facts_key("hv-lone") and got[0][1] - sent < 2.0  # at once: the first message of a batch wakes it
        time.sleep(WAIT * 2)  # the subscriber is back waiting for the next message
        producer.publish(body("hv-a", 1), exchange=EVENTS_EXCHANGE, routing_key=facts_key("hv-a"))
        time.sleep(0.05)
        producer.publish(body("hv-b", 1), exchange=EVENTS_EXCHANGE, routing_key=facts_key("hv-b"))
        wait_until(lambda: len(got) == 3, timeout=10, what="two messages 50 ms apart")
        # the first woke the subscriber; the second waited for the rest of the linger (taken with any others)
        assert got[2][1] - got[1][1] >= WAIT * 0.8, got
        for i in range(30):
            producer.publish(body(f"hv{i}", 1), exchange=EVENTS_EXCHANGE, routing_key=facts_key(f"hv{i}"))
        wait_until(lambda: len(got) == 33, timeout=10, what="a burst of 30")
        assert {key for key, _ in got[3:]} == {facts_key(f"hv{i}") for i in range(30)}
        conn.release()
    finally:
        sub.stop()
