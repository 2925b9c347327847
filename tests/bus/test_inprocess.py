"""The in-process bus (memory://): requests go from the gateway's client to the services' threads through their
inboxes, with the same replies, errors and deadlines as on RabbitMQ; events and facts through topic exchanges.
It is one object, shared only by the parties it is handed to."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.waiting import wait_until
from vmsched.bus import BusTimeout, RequestError
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.rabbitmq.connection import open_connection
from vmsched.bus.options import BusOptions
from vmsched.facts.subscription import FactsSubscriber, SnapshotListener
from vmsched.bus.inprocess import InProcessClient, InProcessTransport, InProcessWorker, Inboxes, Request, \
    topic_matches
from vmsched.bus.interface import Topic
from vmsched.bus.topology import EVENTS_EXCHANGE, REQUEST_QUEUES
from vmsched.bus.transport import open_transport
from vmsched.bus.rabbitmq.worker import ServiceWorker
from vmsched.messages import Envelope, Op

FILTER, SCORE, BALANCE = REQUEST_QUEUES[Op.FILTER], REQUEST_QUEUES[Op.SCORE], REQUEST_QUEUES[Op.BALANCE]


def _handler(env: Envelope) -> dict[str, Any]:
    if env.body.get("refuse"):
        raise RequestError("refused: " + env.body["refuse"], code="invalid", details=["a: bad"])
    if env.body.get("crash"):
        raise KeyError("bug")
    if env.body.get("sleep"):
        time.sleep(env.body["sleep"])
    return {"op": env.op, "echo": env.body, "thread": threading.current_thread().name}


@pytest.fixture
def bus() -> InProcessTransport:
    return InProcessTransport()


@pytest.fixture
def scoring(bus: InProcessTransport) -> Iterator[InProcessWorker]:
    worker = bus.worker("scoring", {FILTER: _handler, SCORE: _handler}, consumers=2)
    worker.start()
    assert worker.ready.wait(5) and worker.connected
    yield worker
    worker.stop()


def test_the_url_chooses_the_transport() -> None:
    assert isinstance(open_transport(BusOptions(url="memory://")), InProcessTransport)
    broker = open_transport(BusOptions(url="amqp://guest:guest@127.0.0.1:1//"))
    assert broker.spans_processes and isinstance(broker.client(), AsyncBusClient)
    assert isinstance(broker.worker("x", {"q": _handler}), ServiceWorker)
    with pytest.raises(ValueError, match="in-process bus"):
        open_connection(BusOptions(url="memory://"))  # never kombu's memory transport


def test_replies_errors_and_deadlines(bus: InProcessTransport, scoring: InProcessWorker) -> None:
    async def scenario() -> None:
        client = bus.client(declare=tuple(REQUEST_QUEUES.values()))
        assert isinstance(client, InProcessClient)
        await client.start()
        try:
            reply = await client.call(FILTER, "filter", {"a": 1}, 5)
            assert reply["op"] == "filter" and reply["echo"] == {"a": 1}
            assert reply["thread"].startswith("scoring-consumer-")  # answered on the service's own threads
            answers = await asyncio.gather(*(client.call(SCORE, "score", {"i": i}, 5) for i in range(40)))
            assert [a["echo"]["i"] for a in answers] == list(range(40))  # each caller gets its own reply
            with pytest.raises(RequestError, match="refused: no") as refused:
                await client.call(FILTER, "filter", {"refuse": "no"}, 5)
            assert refused.value.code == "invalid" and refused.value.details == ["a: bad"]
            with pytest.raises(RequestError, match="internal error in scoring: KeyError"):
                await client.call(FILTER, "filter", {"crash": True}, 5)
            with pytest.raises(BusTimeout):
                await client.call(FILTER, "filter", {"sleep": 0.6}, 0.2)
            assert await client.ping(SCORE)
        finally:
            await client.close()

    asyncio.run(scenario())


def test_kombus_memory_transport_is_not_used() -> None:
    """An all-in-one's request, reply, event and facts paths, in a fresh interpreter: kombu's memory transport is
    never even imported."""
    code = """
import asyncio, sys
from vmsched.bus.inprocess import InProcessTransport
from vmsched.facts.subscription import FactsSubscriber
bus = InProcessTransport()
worker = bus.worker("s", {"q": lambda env: {"ok": 1}})
worker.start()
got = []
sub = FactsSubscriber(bus, "s", lambda raw, key: got.append(key))
sub.start()
async def main():
    client = bus.client()
    await client.start()
    assert await client.call("q", "x", {}, 5) == {"ok": 1}
asyncio.run(main())
bus.events("agent").publish("agent.h1.facts", {})
assert bus.call("q", "x", {}) == {"ok": 1}
print("kombu.transport.memory" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_request_past_its_deadline_is_not_run(bus: InProcessTransport) -> None:
    ran: list[Envelope] = []
    worker = bus.worker("balancer", {BALANCE: lambda env: ran.append(env) or {}}, consumers=1)
    late = Envelope(op="balance", deadline=time.time() - 1, body={}).model_dump_json().encode()
    replies: list[bytes] = []
    bus.inboxes.put(Request(BALANCE, late, "late-1", replies.append))  # waits for its worker, as on a queue
    worker.start()
    try:
        assert worker.ready.wait(5)
        done = threading.Event()
        fresh = Envelope(op="balance", deadline=time.time() + 5, body={"n": 2}).model_dump_json().encode()
        bus.inboxes.put(Request(BALANCE, fresh, "fresh-2", lambda raw: (replies.append(raw), done.set())))
        assert done.wait(5)
    finally:
        worker.stop()
    assert [env.body for env in ran] == [{"n": 2}] and len(replies) == 1  # the late one: dropped, unanswered


def test_a_request_sent_before_its_service_starts_is_answered_once_it_does(bus: InProcessTransport) -> None:
    worker = bus.worker("scoring", {FILTER: _handler, SCORE: _handler}, consumers=2)

    async def scenario() -> None:
        client = bus.client()
        await client.start()
        try:
            call = asyncio.ensure_future(client.call(FILTER, "filter", {"early": True}, 10))
            await asyncio.sleep(0.3)
            assert not call.done()
            worker.start()
            assert (await call)["echo"] == {"early": True}
            worker.stop()  # and again: a restarted worker takes the same inbox
            worker.start()
            assert (await client.call(SCORE, "score", {"again": True}, 5))["echo"] == {"again": True}
        finally:
            await client.close()
            worker.stop()

    asyncio.run(scenario())


def test_two_buses_share_nothing(scoring: InProcessWorker) -> None:
    """A bus joins only the parties it is handed to: another one's client finds no service."""
    with pytest.raises(BusTimeout, match=f"no reply from {FILTER} within 0.3 s"):
        InProcessTransport().call(FILTER, "filter", {}, timeout=0.3)


def test_inboxes_of_one_process() -> None:
    inboxes = Inboxes()
    with pytest.raises(ValueError, match="at least one queue"):
        inboxes.bind([])
    for queue, body in ((SCORE, b"1"), (FILTER, b"2"), (SCORE, b"3")):
        inboxes.put(Request(queue, body, body.decode(), None))
    inbox = inboxes.bind([FILTER, SCORE])  # what waited in both queues, now one inbox (each queue's in its order)
    taken = [inbox.get_nowait() for _ in range(3)]
    assert sorted(r.body for r in taken) == [b"1", b"2", b"3"] and inbox.empty()
    assert [r.body for r in taken if r.queue == SCORE] == [b"1", b"3"]
    assert inboxes.bind([SCORE, FILTER]) is inbox  # a second worker of the same queues shares it
    with pytest.raises(ValueError, match="overlap another worker"):
        inboxes.bind([FILTER])  # its threads would take score requests it has no handler for
    inboxes.put(Request(SCORE, b"4", "4", None))
    inboxes.put(Request(FILTER, b"5", "5", None))
    inboxes.release(inbox)
    assert inbox.qsize() == 2  # one worker of it left
    inboxes.release(inbox)  # none left: each request waits in its own queue's inbox again
    alone = inboxes.bind([FILTER])  # the filter queue may be served alone now, and gets only its own requests
    assert alone is not inbox and [alone.get_nowait().body] == [b"5"] and alone.empty()
    assert [inboxes.bind([SCORE]).get_nowait().body] == [b"4"]


def test_a_blocking_call(bus: InProcessTransport, scoring: InProcessWorker) -> None:
    """Transport.call (the CLI's and tools' client) reaches the services of its bus."""
    assert bus.call(FILTER, "filter", {"a": 2}, timeout=5)["echo"] == {"a": 2}
    with pytest.raises(RequestError, match="refused: no"):
        bus.call(SCORE, "score", {"refuse": "no"}, timeout=5)
    with pytest.raises(BusTimeout, match=f"no reply from {BALANCE} within 0.3 s"):
        bus.call(BALANCE, "balance", {}, timeout=0.3)  # no balancer on this bus: it waits, then fails


@pytest.mark.parametrize("pattern, key, matches", [
    ("agent.*.facts", "agent.h1.facts", True), ("agent.*.facts", "agent.h1.applied", False),
    ("agent.*.facts", "agent.h.1.facts", False), ("agent.#", "agent.h1.facts", True), ("agent.#", "agent", True),
    ("#", "anything.at.all", True), ("gateway.decisions.query", "gateway.decisions.query", True),
    ("a.#.z", "a.z", True), ("a.#.z", "a.b.c.z", True), ("a.#.z", "a.b.c", False),
])
def test_topic_matching_is_amqps(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches


def test_events_reach_the_subscribers_whose_keys_match(bus: InProcessTransport) -> None:
    got: dict[str, list[tuple[str, dict]]] = {"facts": [], "all": []}
    subs = [bus.subscribe(name, Topic(f"q.{name}", EVENTS_EXCHANGE, keys, 10),
                          lambda raw, key, name=name: got[name].append((key, json.loads(raw))))
            for name, keys in (("facts", ("agent.*.facts",)), ("all", ("agent.#", "gateway.x")))]
    for sub in subs:
        sub.start()
    try:
        events = bus.events("agent")
        assert events.publish("agent.h1.facts", {"n": 1}) and events.publish("agent.h1.applied", {"n": 2})
        wait_until(lambda: len(got["all"]) == 2 and len(got["facts"]) == 1, 5, what="both subscribers")
        assert [(k, b["n"], b["service"]) for k, b in got["facts"]] == [("agent.h1.facts", 1, "agent")]
        assert [k for k, _ in got["all"]] == ["agent.h1.facts", "agent.h1.applied"]
    finally:
        for sub in subs:
            sub.stop()
    events.publish("agent.h1.facts", {"n": 3})  # after the subscription stopped: nobody gets it
    time.sleep(0.1)
    assert len(got["facts"]) == 1


def test_a_facts_subscriber_asks_the_agents_for_a_snapshot(bus: InProcessTransport) -> None:
    asked = threading.Event()
    listener = SnapshotListener(bus, "h1", asked.set)
    listener.start()
    assert listener.ready.wait(5)
    facts: list[str] = []
    subscriber = FactsSubscriber(bus, "scoring", lambda raw, key: facts.append(key))
    subscriber.start()
    try:
        assert asked.wait(5)  # its snapshot request reached the agent's listener
        bus.events("agent").publish("agent.h1.facts", {"host_id": "h1"})
        wait_until(lambda: facts == ["agent.h1.facts"], 5, what="the facts")
    finally:
        subscriber.stop()
        listener.stop()
