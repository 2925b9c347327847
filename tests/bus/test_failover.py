"""Several broker URLs (a cluster's nodes), and the gateway client's recovery when its reply queue dies.

The 3-node cluster under load is tests/e2e/test_rabbitmq_cluster.py (slow); here: the URL list
(masking, the command-line rule, the URL file), connecting past a dead node, and
a request in flight whose exclusive reply queue is deleted under it (the broker
cancels the consumer, as when the queue's node dies): the client re-declares a
reply queue on a new connection and sends the request again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit
from pathlib import Path

import pytest
from kombu import Queue

from tests.support.net import free_port
from vmsched import metrics
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.rabbitmq.connection import node, ensure_exchanges, open_connection, safe_release
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.events import EventPublisher
from vmsched.bus import BusUnavailable
from vmsched.bus.rabbitmq.client import MAX_SENDS
from vmsched.bus.topology import EVENTS_EXCHANGE, REQUESTS_EXCHANGE
from vmsched.bus.options import has_password, mask, read_url_file, url_argument
from vmsched.bus.rabbitmq.worker import ServiceWorker

TWO = "amqp://gw:s3cret@node1:5672/vmsched;amqps://gw:other@node2:5671/vmsched"


def test_a_url_list_is_masked_and_kept_off_the_command_line(tmp_path: Path):
    assert mask(TWO) == "amqp://gw:***@node1:5672/vmsched;amqps://gw:***@node2:5671/vmsched"
    assert has_password("amqp://node1/vmsched;amqp://gw:pw@node2/vmsched")  # the second one's password counts
    assert not has_password("amqp://gw@node1/vmsched;amqp://gw@node2/vmsched")
    with pytest.raises(argparse.ArgumentTypeError, match="visible to every user") as exc:
        url_argument("amqp://gw@node1/v;amqp://gw:pw@node2/v")
    assert "pw" not in str(exc.value)
    assert url_argument("amqp://gw@node1/v;amqp://gw@node2/v")
    url_file = tmp_path / "urls"
    url_file.write_text("# the cluster\namqp://gw:a@node1/v\n\namqp://gw:a@node2/v;amqp://gw:a@node3/v\n")
    assert read_url_file(url_file) == "amqp://gw:a@node1/v;amqp://gw:a@node2/v;amqp://gw:a@node3/v"
    url_file.write_text("amqp://gw:a@node1/v\nnode2\n")
    with pytest.raises(ValueError, match="does not hold a URL"):
        read_url_file(url_file)


def test_the_nodes_of_a_cluster_are_all_plain_or_all_tls():
    with pytest.raises(ValueError, match="all be amqp:// or all amqps://") as exc:
        BusOptions(url=TWO)
    assert "s3cret" not in str(exc.value) and "other" not in str(exc.value)
    tls = BusOptions(url="amqps://gw:a@node1:5671/v;amqps://gw:a@node2:5671/v")
    assert tls.urls == ("amqps://gw:a@node1:5671/v", "amqps://gw:a@node2:5671/v")
    assert tls.ssl_options(tls.urls[1])["server_hostname"] == "node2"  # each node's certificate for its own name
    assert "a@" not in repr(tls)


@pytest.mark.rabbitmq
def test_connecting_skips_a_dead_node_and_tries_it_last(rabbit_vhost: str):
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/x"  # nothing listens there
    options = BusOptions(url=f"{dead};{rabbit_vhost}", connect_timeout=1)
    conn = open_connection(options)
    try:
        assert node(conn) == f"{urlsplit(rabbit_vhost).hostname}:{urlsplit(rabbit_vhost).port}"
    finally:
        safe_release(conn)
    started = time.monotonic()
    conn = open_connection(options)  # the dead node is now tried after the live one
    try:
        assert node(conn) == f"{urlsplit(rabbit_vhost).hostname}:{urlsplit(rabbit_vhost).port}"
    finally:
        safe_release(conn)
    assert time.monotonic() - started < 5
    with pytest.raises(Exception, match="no broker node answers") as exc:
        open_connection(BusOptions(url=f"{dead};{dead.replace('/x', '/y')}", connect_timeout=1))
    assert "guest:guest" not in str(exc.value)


def _resent(reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("vmsched_bus_resent_total", {"service": "failover-test", "reason": reason}) or 0


def _reconnects() -> float:
    return metrics.REGISTRY.get_sample_value("vmsched_bus_reconnects_total", {"service": "failover-test"}) or 0


def _reply_queues(vhost: str) -> list[str]:
    """The reply queues on ``vhost`` (the client's exclusive one, the only one there while it runs)."""
    out = subprocess.run(["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("vmsched.reply.")]


@pytest.mark.rabbitmq
def test_a_request_whose_reply_queue_died_is_sent_again(rabbit_vhost: str):
    vhost = rabbit_vhost.rsplit("/", 1)[1]
    queue = f"test.failover.{time.monotonic_ns()}"
    started, deleted = threading.Event(), threading.Event()
    handled: list[float] = []

    def slow(env):  # noqa: ANN001 - the first delivery waits until the test has deleted the reply queue
        handled.append(time.time())
        if len(handled) == 1:
            started.set()
            deleted.wait(30)  # answers only once its reply queue is gone
        return {"n": env.body["n"]}

    worker = ServiceWorker(BusOptions(url=rabbit_vhost), "failover-svc", {queue: slow}, consumers=2)
    worker.start()

    async def scenario() -> None:
        client = AsyncBusClient(BusOptions(url=rabbit_vhost), declare=(queue,), service="failover-test")
        await client.start()
        try:
            assert await asyncio.to_thread(worker.ready.wait, 20)
            before = _resent("reconnect")
            [old_queue] = await asyncio.to_thread(_reply_queues, vhost)
            call = asyncio.ensure_future(client.call(queue, "x", {"n": 7}, 15))
            assert await asyncio.to_thread(started.wait, 10)
            out = await asyncio.to_thread(subprocess.run, ["rabbitmqctl", "-q", "delete_queue", "-p", vhost, old_queue],
                                          capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            deleted.set()
            assert await asyncio.wait_for(call, 15) == {"n": 7}
            assert client.connected and await asyncio.to_thread(_reply_queues, vhost) not in ([], [old_queue])
            assert _resent("reconnect") == before + 1
            assert len(handled) == 2  # the first reply went to the deleted queue; the second one came back
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        deleted.set()
        worker.stop()


@pytest.mark.rabbitmq
def test_an_event_after_the_connection_broke_goes_out_on_a_new_one(rabbit_vhost: str):
    pub = EventPublisher(rabbit_vhost, service="failover-test")
    conn = open_connection(BusOptions(url=rabbit_vhost))
    try:
        ensure_exchanges(conn, (EVENTS_EXCHANGE,))
        tap = Queue("", exchange=EVENTS_EXCHANGE, routing_key="agent.failover.#", exclusive=True)(conn.default_channel)
        tap.declare()
        assert pub.publish("agent.failover.one", {"n": 1})
        pub._conn.connection.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]  # as when its node dies
        assert pub.publish("agent.failover.two", {"n": 2})  # not dropped: sent again on a new connection
        got = []
        for _ in range(50):
            message = tap.get(no_ack=True)
            if message is not None:
                got.append(json.loads(message.body)["n"])
            if len(got) == 2:
                break
            time.sleep(0.1)
        assert got == [1, 2]
    finally:
        pub.close()
        safe_release(conn)


@pytest.mark.rabbitmq
def test_a_refused_request_goes_out_again_on_a_new_connection_then_fails(rabbit_vhost: str):
    """A nack (as a quorum queue gives while it elects a leader) replaces the connection and sends the request
    again; a broker that keeps refusing it fails it after MAX_SENDS sends, long before its deadline."""
    queue = f"test.nack.{time.monotonic_ns()}"
    conn = open_connection(BusOptions(url=rabbit_vhost))
    try:
        ensure_exchanges(conn, (REQUESTS_EXCHANGE,))
        Queue(queue + ".full", exchange=REQUESTS_EXCHANGE, routing_key=queue, exclusive=True,  # refuses everything
              queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"})(conn.default_channel).declare()

        async def scenario() -> None:
            client = AsyncBusClient(BusOptions(url=rabbit_vhost), declare=(queue,), service="failover-test")
            await client.start()
            try:
                before, reconnects = _resent("nack"), _reconnects()
                started = time.monotonic()
                with pytest.raises(BusUnavailable, match="publisher nack"):
                    await client.call(queue, "x", {}, 20)
                assert time.monotonic() - started < 10
                assert _resent("nack") == before + MAX_SENDS - 1 and _reconnects() > reconnects
            finally:
                await client.close()

        asyncio.run(scenario())
    finally:
        safe_release(conn)


@pytest.mark.rabbitmq
def test_an_overdue_confirm_sends_again_and_the_second_reply_is_dropped(rabbit_vhost: str):
    """A request whose confirm is overdue (the timer fired by hand here: a real broker confirms too fast) is
    sent again; both copies are answered, the caller gets one reply and the other is counted as a duplicate."""
    queue = f"test.overdue.{time.monotonic_ns()}"
    release = threading.Event()
    handled: list[int] = []

    def held(env):  # noqa: ANN001 - both copies wait until the second one is out
        handled.append(1)
        release.wait(20)
        return {"ok": 1}

    worker = ServiceWorker(BusOptions(url=rabbit_vhost), "failover-svc", {queue: held}, consumers=2)
    worker.start()

    def duplicates() -> float:
        return metrics.REGISTRY.get_sample_value("vmsched_bus_duplicate_replies_total", {"service": "failover-test"}) or 0

    async def scenario() -> None:
        client = AsyncBusClient(BusOptions(url=rabbit_vhost), declare=(queue,), service="failover-test")
        await client.start()
        try:
            assert await asyncio.to_thread(worker.ready.wait, 20)
            resent, dropped = _resent("confirm_timeout"), duplicates()
            call = asyncio.ensure_future(client.call(queue, "x", {}, 15))
            await asyncio.sleep(0)  # the call hands its request to the link
            # after the request: as if its confirm were overdue
            client._confirm_overdue(next(iter(client._requests)))
            for _ in range(100):
                if _resent("confirm_timeout") > resent:
                    break
                await asyncio.sleep(0.05)
            assert _resent("confirm_timeout") == resent + 1
            for _ in range(400):  # bounded: 20 s
                if len(handled) >= 2:
                    break
                await asyncio.sleep(0.05)
            assert len(handled) == 2  # the first copy and the one sent again, both being handled
            release.set()
            assert await asyncio.wait_for(call, 15) == {"ok": 1}
            for _ in range(100):  # the other copy's reply
                if duplicates() > dropped:
                    break
                await asyncio.sleep(0.05)
            assert duplicates() == dropped + 1
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        worker.stop()


@pytest.mark.rabbitmq
def test_a_request_that_keeps_breaking_the_connection_fails_fast(rabbit_vhost: str):
    """Its queue exists with other arguments (PRECONDITION_FAILED closes the channel): three tries, then an error
    long before its deadline, and the client is connected again for the next call."""
    queue = f"test.precondition.{time.monotonic_ns()}"
    conn = open_connection(BusOptions(url=rabbit_vhost))
    try:
        kombu_queue = Queue(queue, durable=True, auto_delete=False)(conn.default_channel)  # the client declares it transient
        kombu_queue.declare()

        async def scenario() -> None:
            client = AsyncBusClient(BusOptions(url=rabbit_vhost), service="failover-test")
            await client.start()
            try:
                started = time.monotonic()
                with pytest.raises(BusUnavailable, match="PRECONDITION_FAILED|inequivalent"):
                    await client.call(queue, "x", {}, 20)
                assert time.monotonic() - started < 10
                for _ in range(100):
                    if client.connected:
                        break
                    await asyncio.sleep(0.05)
                assert client.connected
            finally:
                await client.close()

        asyncio.run(scenario())
        kombu_queue.delete()
    finally:
        safe_release(conn)
