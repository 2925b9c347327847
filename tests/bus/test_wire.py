"""What the gateway's client and the service worker put on RabbitMQ: the properties older releases read."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from kombu import Queue

from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection, safe_release
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import EXCHANGES, REPLY_EXCHANGE, REQUESTS_EXCHANGE
from vmsched.bus.rabbitmq.worker import ServiceWorker

pytestmark = pytest.mark.rabbitmq


def test_a_request_and_its_reply_on_the_wire(rabbit_vhost: str) -> None:
    queue = f"test.wire.{uuid.uuid4().hex[:8]}"
    conn = open_connection(BusOptions(url=rabbit_vhost))
    try:
        ensure_exchanges(conn, EXCHANGES)
        tap = Queue(queue + ".tap", exchange=REQUESTS_EXCHANGE, routing_key=queue, exclusive=True)(conn.default_channel)
        tap.declare()

        async def send() -> None:
            client = AsyncBusClient(BusOptions(url=rabbit_vhost), service="wire-test")
            await client.start()
            try:
                call = asyncio.ensure_future(client.call(queue, "filter", {"hosts": ["h1"]}, 1.5))
                await asyncio.sleep(0.5)
                assert not call.done()  # nobody answers it: the tap holds it
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
            finally:
                await client.close()

        asyncio.run(send())
        message = tap.get(no_ack=True)
        assert message is not None
        props = message.properties
        assert not message.headers
        assert props["content_type"] == "application/json" and props["content_encoding"] == "utf-8"
        assert props["reply_to"].startswith("vmsched.reply.") and props["correlation_id"]
        assert props["delivery_mode"] == 2 and props["priority"] == 0
        assert 0 < int(props["expiration"]) <= 1500  # milliseconds left of the deadline
        body = json.loads(message.body)
        assert body["op"] == "filter" and body["body"] == {"hosts": ["h1"]} and body["deadline"] > time.time() - 5
    finally:
        safe_release(conn)


def test_a_reply_goes_where_its_sender_waits(rabbit_vhost: str) -> None:
    """A reply goes to the reply exchange, keyed by the sender's reply queue."""
    queue = f"test.wire.{uuid.uuid4().hex[:8]}"
    worker = ServiceWorker(BusOptions(url=rabbit_vhost), "wire-svc", {queue: lambda env: {"n": env.body["n"]}})
    worker.start()
    conn = open_connection(BusOptions(url=rabbit_vhost))
    try:
        assert worker.ready.wait(20)
        channel = conn.default_channel
        for n in (1, 2):
            reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"
            tap = Queue(reply_queue, exchange=REPLY_EXCHANGE, routing_key=reply_queue, exclusive=True)(channel)
            tap.declare()
            producer = conn.Producer(channel, auto_declare=False)
            producer.publish(json.dumps({"v": 2, "op": "x", "deadline": time.time() + 10, "body": {"n": n}}).encode(),
                             exchange="", routing_key=queue, content_type="application/json",
                             content_encoding="utf-8", correlation_id=f"wire-{n}", reply_to=reply_queue)
            for _ in range(100):
                message = tap.get(no_ack=True)
                if message is not None:
                    break
                time.sleep(0.05)
            assert message is not None, n
            assert message.properties["correlation_id"] == f"wire-{n}"
            assert message.properties["content_type"] == "application/json"
            assert json.loads(message.body)["body"] == {"n": n}
    finally:
        safe_release(conn)
        worker.stop()


def test_py_amqp_still_offers_what_the_connection_overrides():
    """vmsched's AmqpConnection turns off ``connection.blocked`` through py-amqp's documented class attribute
    ``negotiate_capabilities``, plugged in through kombu's pyamqp transports: this fails first if either moves."""
    import amqp.connection
    from kombu.transport import pyamqp

    from vmsched.bus.rabbitmq.connection import TRANSPORTS, AmqpConnection

    assert amqp.connection.NEGOTIATE_CAPABILITIES.get("connection.blocked") is True
    assert amqp.Connection.negotiate_capabilities is amqp.connection.NEGOTIATE_CAPABILITIES
    assert issubclass(pyamqp.Connection, amqp.Connection)
    assert pyamqp.Transport.Connection is pyamqp.Connection and pyamqp.SSLTransport.Connection is pyamqp.Connection
    assert AmqpConnection.negotiate_capabilities == {**amqp.connection.NEGOTIATE_CAPABILITIES,
                                                     "connection.blocked": False}
    assert {t.Connection for t in TRANSPORTS.values()} == {AmqpConnection}


@pytest.mark.rabbitmq
def test_a_connection_does_not_announce_connection_blocked(rabbit_vhost: str):
    conn = open_connection(BusOptions(url=rabbit_vhost))
    try:
        assert conn.connection.client_properties["capabilities"]["connection.blocked"] is False
    finally:
        safe_release(conn)
