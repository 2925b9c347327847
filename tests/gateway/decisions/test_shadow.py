"""The gateway's shadow store on the real transports: comparisons published as events are kept by ID, invalid
messages are counted and logged once, never raised, and the store stays bounded."""

from __future__ import annotations

import json
import logging
from typing import Iterator

import pytest

from tests.support.shadow import comparison, publish
from tests.support.waiting import wait_until
from vmsched.bus.inprocess import InProcessTransport
from vmsched.bus.interface import Transport
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.bus.transport import open_transport
from vmsched.gateway.decisions import shadow as shadow_module
from vmsched.gateway.decisions.shadow import ShadowStore
from vmsched.metrics import REGISTRY

IDS = [f"{i:032x}" for i in range(1, 40)]


def _store(transport: Transport, size: int = 1000) -> Iterator[ShadowStore]:
    store = ShadowStore(transport, size)
    store.start()
    try:
        assert store.ready.wait(30), "the store did not subscribe"
        yield store
    finally:
        store.stop()


@pytest.fixture
def memory() -> Iterator[tuple[InProcessTransport, ShadowStore]]:
    transport = InProcessTransport()
    for store in _store(transport):
        yield transport, store


def test_a_published_comparison_is_kept_by_its_id_with_its_sender_and_time(memory) -> None:
    transport, store = memory
    publish(transport, comparison(IDS[0]), service="scoring")
    publish(transport, comparison(IDS[1], op="score", status="same", what="ranks h1 first", rows=[]),
            service="balancer")
    wait_until(lambda: store.get(IDS[1]), 10, 0.02, "the second comparison")
    first = store.get(IDS[0])
    assert first is not None and first.status == "changed" and first.rows[0].candidate["result"] == "dropped"
    assert first.service == "scoring" and first.time > 0  # the event's sender and time (event_bytes)
    assert store.get(IDS[1]).service == "balancer"
    assert store.counts() == {"same": 1, "changed": 1, "unknown": 0, "error": 0}
    listed = store.recent(10)
    assert [c.id for c in listed] == [IDS[1], IDS[0]]  # newest first
    assert [c.id for c in store.recent(10, statuses=("changed",))] == [IDS[0]]
    assert [c.id for c in store.recent(10, op="score")] == [IDS[1]]
    assert store.recent(10, vm="another") == []


def test_the_sender_is_the_routing_keys_whatever_the_body_claims(memory) -> None:
    transport, store = memory
    events = transport.events("balancer")  # the body says balancer, the key scoring (the broker checks keys)
    try:
        assert events.publish("shadow.scoring", comparison(IDS[2]))
    finally:
        events.close()
    assert wait_until(lambda: store.get(IDS[2]), 10, 0.02, "the comparison").service == "scoring"


def test_a_comparison_sent_again_replaces_the_first(memory) -> None:
    transport, store = memory
    publish(transport, comparison(IDS[0], status="unknown", what="the candidate lacks KeepEven", rows=[]))
    publish(transport, comparison(IDS[0], status="error", what="KeepEven timed out", rows=[]))
    wait_until(lambda: store.received == 2, 10, 0.02, "both")
    assert store.get(IDS[0]).status == "error" and len(store.recent(10)) == 1
    assert store.counts() == {"same": 0, "changed": 0, "unknown": 0, "error": 1}


def _refused() -> float:
    return REGISTRY.get_sample_value("vmsched_shadow_refused_total") or 0.0


def test_invalid_messages_are_counted_and_logged_once_never_raised(memory, caplog) -> None:
    transport, store = memory
    caplog.set_level(logging.WARNING, logger="vmsched.gateway.shadow")
    refused_before = _refused()
    events = transport.events("scoring")
    bad = [
        comparison(IDS[0], status="maybe"),  # not a status
        comparison(IDS[1], v=99),  # another contract version
        {k: v for k, v in comparison(IDS[2]).items() if k != "id"},  # no ID
        comparison(IDS[3], rows=[{"host": "h"}] * 21),  # more rows than a comparison holds
    ]
    for body in bad:
        assert events.publish("shadow.scoring", body)
    transport.exchanges.publish(EVENTS_EXCHANGE, "shadow.scoring", b"{not json")  # what a broken sender puts
    transport.exchanges.publish(EVENTS_EXCHANGE, "shadow.scoring", b"x" * (shadow_module.MAX_MESSAGE + 1))
    publish(transport, comparison(IDS[4]))  # a good one after them is still kept
    wait_until(lambda: store.get(IDS[4]), 10, 0.02, "the good comparison after the bad ones")
    events.close()
    assert store.invalid == 6 and store.received == 1
    assert _refused() - refused_before == 6  # the metric counts them too
    assert all(store.get(i) is None for i in IDS[:4])
    lines = [r.getMessage() for r in caplog.records if r.name == "vmsched.gateway.shadow"]
    assert len(lines) == 1 and "status" in lines[0] and "refused" in lines[0], lines  # once a minute at most


def test_the_store_is_bounded_the_oldest_leave() -> None:
    transport = InProcessTransport()
    for store in _store(transport, size=5):
        for i, record_id in enumerate(IDS[:12]):  # one at a time: the queue is bounded by the size too
            publish(transport, comparison(record_id, status="same" if i % 2 else "changed", rows=[]))
            wait_until(lambda: store.received == i + 1, 10, 0.01, f"comparison {i}")
        assert [c.id for c in store.recent(100)] == list(reversed(IDS[7:12]))
        assert store.get(IDS[6]) is None and sum(store.counts().values()) == 5
        assert store.counts() == {"same": 3, "changed": 2, "unknown": 0, "error": 0}  # IDS[7..11]
        assert store.received == 12


@pytest.mark.rabbitmq
def test_on_rabbitmq_every_gateway_keeps_every_comparison(rabbit_vhost: str) -> None:
    """Two gateways' stores on a private vhost: each has its own queue, so each sees every comparison."""
    gateway, service = (open_transport(BusOptions(rabbit_vhost)) for _ in range(2))
    stores = [ShadowStore(gateway), ShadowStore(gateway)]
    for store in stores:
        store.start()
    try:
        assert all(store.ready.wait(30) for store in stores)
        assert stores[0].queue_name != stores[1].queue_name
        publish(service, comparison(IDS[0]), service="scoring")
        publish(service, comparison(IDS[1], op="balance", status="same", rows=[]), service="balancer")
        events = service.events("scoring")
        events.publish("shadow.scoring", {"id": IDS[2], "what": "no op, no status"})
        events.close()
        for store in stores:
            wait_until(lambda: store.get(IDS[1]) is not None and store.invalid == 1, 20, 0.05, "both, and the bad one")
            got = store.get(IDS[0])
            assert got is not None and got.service == "scoring" and got.rows[0].host == comparison(IDS[0])["rows"][0]["host"]
            assert json.loads(got.model_dump_json())["what"] == comparison(IDS[0])["what"]
            assert store.counts()["changed"] == 1 and store.counts()["same"] == 1
    finally:
        for store in stores:
            store.stop()
