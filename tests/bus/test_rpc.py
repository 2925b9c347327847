"""The bus itself, on the in-process transport and on RabbitMQ: RPC, errors, deadlines."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from typing import Iterator

import pytest
from kombu import Consumer, Producer, Queue

from tests.support.stack import BUSES
from vmsched import metrics
from vmsched.bus import BusTimeout, BusUnavailable, RequestError
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.topology import reply_queue
from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection, safe_release
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.events import EventPublisher
from vmsched.bus.inprocess import InProcessTransport, Request
from vmsched.bus.interface import Transport, Worker
from vmsched.bus.transport import open_transport
from vmsched.messages import CONTRACT_VERSION, Envelope, ReplyEnvelope


@pytest.fixture(params=BUSES)
def transport(request: pytest.FixtureRequest) -> Transport:
    url = "memory://" if request.param == "memory" else request.getfixturevalue("rabbit_vhost")
    return open_transport(BusOptions(url=url))


@pytest.fixture
def echo(transport: Transport) -> Iterator[tuple[Worker, str, list[Envelope]]]:
    queue = f"test.echo.{uuid.uuid4().hex[:8]}"
    seen: list[Envelope] = []

    def handler(env: Envelope) -> dict:
        seen.append(env)
        if env.body.get("fail"):
            raise RequestError("refused: " + env.body["fail"])
        if env.body.get("refuse"):
            raise RequestError("two reasons", code="invalid", details=["a: bad", "b: worse"])
        if env.body.get("crash"):
            raise KeyError("bug")
        if env.body.get("sleep"):
            time.sleep(env.body["sleep"])
        return {"echo": env.body, "op": env.op}

    worker = transport.worker("test", {queue: handler}, consumers=2)
    worker.start()
    assert worker.ready.wait(10)
    yield worker, queue, seen
    worker.stop()


def test_async_rpc_roundtrip_and_errors(transport: Transport, echo):
    _, queue, _ = echo

    async def scenario() -> None:
        client = transport.client(declare=(queue,))
        await client.start()
        try:
            assert await client.call(queue, "x", {"a": 1}, 5) == {"echo": {"a": 1}, "op": "x"}
            answers = await asyncio.gather(*(client.call(queue, "x", {"i": i}, 5) for i in range(50)))
            assert [a["echo"]["i"] for a in answers] == list(range(50))  # replies matched by correlation id
            with pytest.raises(RequestError, match="refused: no"):
                await client.call(queue, "x", {"fail": "no"}, 5)
            with pytest.raises(RequestError, match="internal error in test: KeyError"):
                await client.call(queue, "x", {"crash": True}, 5)
            assert await client.call(queue, "x", {"after": "crash"}, 5)  # the consumer survived
            with pytest.raises(BusTimeout):
                await client.call(queue, "x", {"sleep": 1.0}, 0.2)
            assert await client.ping(queue)
        finally:
            await client.close()

    asyncio.run(scenario())


def test_sync_rpc_call(transport: Transport, echo):
    _, queue, _ = echo
    assert transport.call(queue, "y", {"b": 2}) == {"echo": {"b": 2}, "op": "y"}
    with pytest.raises(RequestError, match="refused"):
        transport.call(queue, "y", {"fail": "x"})


def _send_unanswered(transport: Transport, queue: str, payload: bytes) -> None:
    """Put ``payload`` as it is on ``queue``, with nobody waiting for a reply."""
    if isinstance(transport, InProcessTransport):
        transport.inboxes.put(Request(queue, payload, "late-1", None))
        return
    conn = open_connection(transport.options)
    try:
        Producer(conn.default_channel).publish(payload, routing_key=queue, content_type="application/json",
                                               content_encoding="utf-8")
    finally:
        conn.release()


def test_expired_requests_are_dropped_unanswered(transport: Transport, echo):
    _, queue, seen = echo
    before = metrics.REGISTRY.get_sample_value("vmsched_bus_expired_total", {"service": "test", "operation": "late"}) or 0
    _send_unanswered(transport, queue, Envelope(op="late", deadline=time.time() - 1, body={}).model_dump_json().encode())
    deadline = time.time() + 10
    while time.time() < deadline:
        value = metrics.REGISTRY.get_sample_value("vmsched_bus_expired_total",
                                                  {"service": "test", "operation": "late"}) or 0
        if value > before:
            break
        time.sleep(0.02)
    assert value == before + 1
    assert not [e for e in seen if e.op == "late"]  # the handler never ran


def test_malformed_request_gets_an_error_reply(transport: Transport, echo):
    _, queue, _ = echo
    reply = ReplyEnvelope.model_validate_json(_raw_reply(transport, queue, b"{not json"))
    assert not reply.ok and "malformed request" in reply.error


def test_error_code_and_details_travel_on_the_reply_envelope(transport: Transport, echo):
    _, queue, _ = echo
    with pytest.raises(RequestError, match="^two reasons$") as sync_error:
        transport.call(queue, "x", {"refuse": True})
    assert sync_error.value.code == "invalid" and sync_error.value.details == ["a: bad", "b: worse"]
    with pytest.raises(RequestError, match="internal error in test: KeyError") as crash:
        transport.call(queue, "x", {"crash": True})
    assert crash.value.code == "internal"

    async def scenario() -> RequestError:
        client = transport.client(declare=(queue,))
        await client.start()
        try:
            with pytest.raises(RequestError) as exc:
                await client.call(queue, "x", {"refuse": True}, 5)
            return exc.value
        finally:
            await client.close()

    error = asyncio.run(scenario())
    assert error.code == "invalid" and error.details == ["a: bad", "b: worse"]


def _raw_reply(transport: Transport, queue: str, payload: bytes) -> bytes:
    """Send ``payload`` as it is and return the reply's bytes."""
    if isinstance(transport, InProcessTransport):
        done, replies = threading.Event(), []
        transport.inboxes.put(Request(queue, payload, "raw-1", lambda raw: (replies.append(raw), done.set())))
        assert done.wait(5)
        return replies[0]

    conn = open_connection(transport.options)
    try:
        channel, replies = conn.default_channel, []
        reply_to = f"test.raw.{uuid.uuid4().hex}"
        with Consumer(channel, [reply_queue(reply_to)], no_ack=True,
                      on_message=lambda message: replies.append(message.body)):
            Producer(channel).publish(payload, routing_key=queue, content_type="application/json",
                                      content_encoding="utf-8", correlation_id="raw-1", reply_to=reply_to)
            deadline = time.monotonic() + 5
            while not replies and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.2)
                except socket.timeout:
                    pass
        assert replies, "no reply within 5 s"
        return replies[0]
    finally:
        safe_release(conn)


def _raw(transport: Transport, queue: str, payload: bytes) -> dict:
    """The raw JSON reply to ``payload``."""
    import json as _json

    return _json.loads(_raw_reply(transport, queue, payload))


@pytest.mark.parametrize("version", [99, 1])
def test_another_version_is_refused_by_name(transport: Transport, echo, version: int):
    _, queue, seen = echo
    reply = _raw(transport, queue, b'{"v": %d, "op": "x", "deadline": %f, "body": {}, "new": 1}'
                 % (version, time.time() + 10))
    assert reply["ok"] is False and reply["code"] == "unsupported_version"
    assert f"contract version {version}, and this reader speaks {CONTRACT_VERSION}" in reply["error"]
    assert reply["v"] == CONTRACT_VERSION and not [e for e in seen if e.op == "x"]  # the handler never ran


def test_client_without_broker_fails_fast():
    async def scenario() -> None:
        client = AsyncBusClient(BusOptions(url="amqp://guest:guest@127.0.0.1:1//", connect_timeout=0.5))
        await client.start()
        try:
            assert not client.connected
            started = time.monotonic()
            with pytest.raises(BusUnavailable, match="message bus unavailable"):
                await client.call("vmsched.filter", "filter", {}, 5)
            assert time.monotonic() - started < 5  # before the request's own deadline
        finally:
            await client.close()

    asyncio.run(scenario())


def test_event_publisher_never_raises_when_the_broker_is_gone():
    pub = EventPublisher("amqp://guest:guest@127.0.0.1:1//", service="test")
    assert pub.publish("agent.h1.applied", {"guest": "g"}) is False
    pub.close()


@pytest.mark.rabbitmq
def test_events_reach_a_topic_subscriber(rabbit_vhost: str):
    from kombu import Consumer, Queue

    from vmsched.bus.topology import EVENTS_EXCHANGE, event_key

    conn = open_connection(BusOptions(url=rabbit_vhost))
    got: list[dict] = []
    done = threading.Event()
    try:
        ensure_exchanges(conn, (EVENTS_EXCHANGE,))  # as a subscriber does: the first publisher may come later
        q = Queue(exchange=EVENTS_EXCHANGE, routing_key="agent.*.applied", exclusive=True, auto_delete=True)
        with Consumer(conn.default_channel, [q], callbacks=[lambda body, m: (got.append(body), done.set())]):
            pub = EventPublisher(rabbit_vhost, service="agent")
            assert pub.publish(event_key("h1", "applied"), {"guest": "g1"})
            pub.close()
            deadline = time.time() + 5
            while not done.is_set() and time.time() < deadline:
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    pass
        assert got and got[0]["guest"] == "g1" and got[0]["service"] == "agent"
    finally:
        conn.release()
