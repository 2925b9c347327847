"""Correlation IDs from a pooled read of the OS's randomness, and the embedded bus's delivery tags."""

from __future__ import annotations

import re

from kombu import Connection, Exchange, Queue

from vmsched.bus import memory
from vmsched.bus.tokens import Unguessable


def test_tokens_are_8_random_bytes_in_hex_and_the_pool_refills():
    token = Unguessable(batch=4)
    seen = [token() for _ in range(41)]  # ten refills and one more
    assert all(re.fullmatch(r"[0-9a-f]{16}", t) for t in seen)
    assert len(set(seen)) == len(seen)


def test_two_sources_do_not_share_tokens():
    a, b = Unguessable(), Unguessable()
    assert {a() for _ in range(100)}.isdisjoint({b() for _ in range(100)})


def test_embedded_bus_delivery_tags_are_unique_and_acks_still_work():
    queue = Queue("tags-test", Exchange("tags-test", type="direct"), routing_key="k")
    got = []
    with Connection(transport=memory.Transport) as conn:
        producer = conn.Producer()
        for i in range(5):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key="k", declare=[queue])
        with conn.Consumer(queue, callbacks=[lambda body, message: (got.append(message), message.ack())]):
            for _ in range(5):
                conn.drain_events(timeout=1)
        tags = [m.delivery_tag for m in got]
        assert len(set(tags)) == 5
        assert [m.payload["n"] for m in got] == list(range(5))
        qos = conn.default_channel.qos
        qos._flush()  # kombu forgets acked deliveries lazily
        assert not qos._delivered  # every delivery acked by its tag
