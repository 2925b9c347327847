"""The all-in-one's scheduling requests go from the gateway's client to the services' threads with no transport
(vmsched.bus.local): the same replies, errors and deadlines as on a bus, and nothing on kombu's memory queues."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from vmsched.bus import BusTimeout, RequestError
from vmsched.bus import memory
from vmsched.bus.client import AsyncBusClient
from vmsched.bus.connection import BusOptions
from vmsched.bus.local import LANES, Lanes, Request, carries
from vmsched.bus.rpc import call
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.bus.worker import ServiceWorker
from vmsched.messages import Envelope, Op

FILTER, SCORE, BALANCE = REQUEST_QUEUES[Op.FILTER], REQUEST_QUEUES[Op.SCORE], REQUEST_QUEUES[Op.BALANCE]
EMBEDDED = BusOptions(url="memory://")


def _handler(env: Envelope) -> dict[str, Any]:
    if env.body.get("refuse"):
        raise RequestError("refused: " + env.body["refuse"], code="invalid", details=["a: bad"])
    if env.body.get("crash"):
        raise KeyError("bug")
    if env.body.get("sleep"):
        time.sleep(env.body["sleep"])
    return {"op": env.op, "echo": env.body, "thread": threading.current_thread().name}


@pytest.fixture
def kombu_puts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues that kombu's in-memory transport puts a message on while the test runs."""
    puts: list[str] = []
    put = memory.Channel._put

    def recording(self: memory.Channel, queue: str, message: Any, **kwargs: Any) -> None:
        puts.append(queue)
        put(self, queue, message, **kwargs)

    monkeypatch.setattr(memory.Channel, "_put", recording)
    return puts


@pytest.fixture
def scoring() -> Iterator[ServiceWorker]:
    worker = ServiceWorker(EMBEDDED, "scoring", routes={FILTER: _handler, SCORE: _handler}, consumers=2)
    worker.start()
    assert worker.ready.wait(5) and worker.connected
    yield worker
    worker.stop()


async def _client() -> AsyncBusClient:
    client = AsyncBusClient(EMBEDDED, declare=tuple(REQUEST_QUEUES.values()))
    await client.start()
    return client


def test_replies_errors_and_deadlines_without_the_transport(scoring: ServiceWorker, kombu_puts: list[str]) -> None:
    async def scenario() -> None:
        client = await _client()
        try:
            reply = await client.call(FILTER, "filter", {"a": 1}, 5)
            assert reply["op"] == "filter" and reply["echo"] == {"a": 1}
            assert reply["thread"].startswith("scoring-consumer-")  # answered on the service's own threads
            answers = await asyncio.gather(*(client.call(SCORE, "score", {"i": i}, 5) for i in range(40)))
            assert [a["echo"]["i"] for a in answers] == list(range(40))  # matched by correlation id
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
    assert not [q for q in kombu_puts if q in REQUEST_QUEUES.values() or q.startswith("vmsched.reply.")]


def test_a_request_past_its_deadline_is_not_run() -> None:
    ran: list[Envelope] = []
    worker = ServiceWorker(EMBEDDED, "balancer", BALANCE, lambda env: ran.append(env) or {}, consumers=1)
    late = Envelope(op="balance", deadline=time.time() - 1, body={}).model_dump_json().encode()
    replies: list[bytes] = []
    LANES.put(Request(BALANCE, late, "late-1", replies.append))  # waits for its worker, as on a queue
    worker.start()
    try:
        assert worker.ready.wait(5)
        done = threading.Event()
        fresh = Envelope(op="balance", deadline=time.time() + 5, body={"n": 2}).model_dump_json().encode()
        LANES.put(Request(BALANCE, fresh, "fresh-2", lambda raw: (replies.append(raw), done.set())))
        assert done.wait(5)
    finally:
        worker.stop()
    assert [env.body for env in ran] == [{"n": 2}] and len(replies) == 1  # the late one: dropped, unanswered


def test_a_request_sent_before_its_service_starts_is_answered_once_it_does(kombu_puts: list[str]) -> None:
    worker = ServiceWorker(EMBEDDED, "scoring", routes={FILTER: _handler, SCORE: _handler}, consumers=2)

    async def scenario() -> None:
        client = await _client()
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
    assert not [q for q in kombu_puts if q in REQUEST_QUEUES.values()]


def test_inboxes_of_one_process() -> None:
    lanes = Lanes()
    assert carries([FILTER, SCORE]) and not carries([FILTER, "test.echo"]) and not carries([])
    with pytest.raises(ValueError, match="not scheduling request queues"):
        lanes.bind([FILTER, "test.echo"])
    for queue, body in ((SCORE, b"1"), (FILTER, b"2"), (SCORE, b"3")):
        lanes.put(Request(queue, body, body.decode(), None))
    inbox = lanes.bind([FILTER, SCORE])  # what waited in both queues, now one inbox (each queue's in its order)
    taken = [inbox.get_nowait() for _ in range(3)]
    assert sorted(r.body for r in taken) == [b"1", b"2", b"3"] and inbox.empty()
    assert [r.body for r in taken if r.queue == SCORE] == [b"1", b"3"]
    assert lanes.bind([SCORE, FILTER]) is inbox  # a second worker of the same queues shares it
    with pytest.raises(ValueError, match="overlap another worker"):
        lanes.bind([FILTER])  # its threads would take score requests it has no handler for
    lanes.put(Request(SCORE, b"4", "4", None))
    lanes.put(Request(FILTER, b"5", "5", None))
    lanes.release(inbox)
    assert inbox.qsize() == 2  # one worker of it left
    lanes.release(inbox)  # none left: each request waits in its own queue's inbox again
    alone = lanes.bind([FILTER])  # the filter queue may be served alone now, and gets only its own requests
    assert alone is not inbox and [alone.get_nowait().body] == [b"5"] and alone.empty()
    assert [lanes.bind([SCORE]).get_nowait().body] == [b"4"]


def test_a_blocking_call_takes_the_inbox_too(scoring: ServiceWorker) -> None:
    """vmsched.bus.rpc.call (the CLI's and tools' client) on memory:// reaches the services of its process."""
    assert call(EMBEDDED, FILTER, "filter", {"a": 2}, timeout=5)["echo"] == {"a": 2}
    with pytest.raises(RequestError, match="refused: no"):
        call(EMBEDDED, SCORE, "score", {"refuse": "no"}, timeout=5)
    with pytest.raises(BusTimeout, match=f"no reply from {BALANCE} within 0.3 s"):
        call(EMBEDDED, BALANCE, "balance", {}, timeout=0.3)  # no balancer in this process: it waits, then fails
