"""The versioned bus contract: a message of another version (or of none) is refused by name, both ways.

Everything here runs on a private vhost of the real RabbitMQ with raw kombu messages, and the agent's replies
are checked against their models op by op.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Iterator

import pytest
from kombu import Consumer, Producer, Queue

from vmsched.agent_contract import EVENTS, OPERATIONS, AgentOp
from vmsched.bus import RequestError
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.broker import BrokerTransport
from vmsched.bus.topology import EXCHANGES, REPLY_EXCHANGE, agent_queue, request_queue
from vmsched.bus.topology import reply_queue as make_reply_queue, route
from vmsched.bus.transport import open_transport
from vmsched.messages import CONTRACT_VERSION
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.agent_driver import guest
from tests.support.waiting import wait_until

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")


def raw_request(url: str, queue: str, message: dict, timeout: float = 10.0) -> dict:
    """Publish ``message`` as it is (no envelope model) and return the raw JSON reply."""
    replies: list[dict] = []
    reply_queue = f"test.reply.{uuid.uuid4().hex}"
    with open_connection(BusOptions(url=url)) as c:
        q = make_reply_queue(reply_queue)
        with Consumer(c.default_channel, [q], callbacks=[lambda body, m: replies.append(json.loads(m.body))],
                      no_ack=True):
            exchange, key = route(queue)
            Producer(c.default_channel).publish(json.dumps(message).encode(), routing_key=key, exchange=exchange,
                                                content_type="application/json", content_encoding="utf-8",
                                                correlation_id="c1", reply_to=reply_queue)
            deadline = time.time() + timeout
            while not replies and time.time() < deadline:
                try:
                    c.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
    assert replies, f"no reply from {queue}"
    return replies[0]


class OtherVersion:
    """A service of another contract version: answers every request on ``queue`` with ``reply``."""

    def __init__(self, url: str, queue: str, reply: dict) -> None:
        self.url, self.queue, self.reply = url, queue, reply
        self.requests: list[dict] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        with open_connection(BusOptions(url=self.url)) as c:
            ensure_exchanges(c, EXCHANGES)
            producer = Producer(c.default_channel)

            def answer(body, message) -> None:
                self.requests.append(json.loads(message.body))
                producer.publish(json.dumps(self.reply).encode(), routing_key=message.properties["reply_to"],
                                 exchange=REPLY_EXCHANGE, correlation_id=message.properties["correlation_id"],
                                 content_type="application/json", content_encoding="utf-8")
                message.ack()

            with Consumer(c.default_channel, [request_queue(self.queue)], callbacks=[answer]):
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        c.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def other_version(rabbit_vhost: str) -> Iterator:
    services: list[OtherVersion] = []

    def make(reply: dict) -> OtherVersion:
        services.append(OtherVersion(rabbit_vhost, f"test.other.{uuid.uuid4().hex[:8]}", reply))
        return services[-1]

    yield make
    for s in services:
        s.close()


def agent_answers(url: str, host: str) -> None:
    """Until the agent of ``host`` answers a ping on the bus (its queue is declared once it consumes)."""
    from vmsched.services.policy_agent.errors import AgentUnavailable
    from vmsched.services.policy_agent.surfaces.client import call_bus

    wait_until(lambda: call_bus(url, host, AgentOp.PING, {}, timeout=1), 15, 0.1, f"the agent of {host} to answer",
               retry_on=(AgentUnavailable,))


# --- a sender of another version against the agent -----------------------------------------------------
@pytest.mark.rabbitmq
@pytest.mark.parametrize("version", [CONTRACT_VERSION + 1, CONTRACT_VERSION - 1])
def test_the_agent_refuses_another_version_by_name(conn, make_agent, rabbit_vhost: str, version):
    host = f"hv-v-{uuid.uuid4().hex[:6]}"
    make_agent(host_id=host, transport=open_transport(BusOptions(url=rabbit_vhost)))
    agent_answers(rabbit_vhost, host)
    request = {"v": version, "op": "cpus", "deadline": time.time() + 10, "body": {}, "something": "new"}
    reply = raw_request(rabbit_vhost, agent_queue(host), request)
    assert reply["ok"] is False and reply["code"] == "unsupported_version"
    assert f"contract version {version}, and this reader speaks {CONTRACT_VERSION}" in reply["error"]
    # and it keeps serving
    reply = BrokerTransport(BusOptions(url=rabbit_vhost)).call(agent_queue(host), "cpus", {}, timeout=10)
    assert reply["dedicated_pool"] == "4-7"


# --- a reader (gateway, CLI) against a service of another version ----------------------------------------
@pytest.mark.rabbitmq
@pytest.mark.parametrize("version", [CONTRACT_VERSION + 1, CONTRACT_VERSION - 1])
def test_clients_refuse_a_reply_of_another_version_by_name(rabbit_vhost: str, other_version, version):
    reply = {"v": version, "ok": True, "error": None, "body": {"whatever": 1}}
    other = other_version(reply)
    with pytest.raises(RequestError, match=f"contract version {version}, and this reader speaks") as exc:
        BrokerTransport(BusOptions(url=rabbit_vhost)).call(other.queue, "cpus", {}, timeout=10)
    assert exc.value.code == "unsupported_version"
    assert other.requests[0]["v"] == CONTRACT_VERSION

    async def via_gateway_client() -> RequestError:
        client = AsyncBusClient(BusOptions(url=rabbit_vhost))
        await client.start()
        try:
            with pytest.raises(RequestError) as caught:
                await client.call(other.queue, "cpus", {}, 10)
            return caught.value
        finally:
            await client.close()

    assert asyncio.run(via_gateway_client()).code == "unsupported_version"


# --- the contract itself ---------------------------------------------------------------------------
def test_every_reply_of_a_real_agent_matches_its_model(conn, make_agent):
    """The reply models are the agent's replies (checked on the test driver, op by op)."""
    from vmsched.services.policy_agent.surfaces.ops import dispatch

    a = make_agent()
    defined = [guest(conn, "t-db", start=False).UUIDString(), guest(conn, "t-web", start=False).UUIDString()]
    wait_until(lambda: all(a.inventory.get(u) for u in defined), what="the agent to see both guests defined")
    bodies = {
        AgentOp.SET_POLICY: {"guest": "t-web", "policy": {"dedicated": 2, "requires": ["t-db"]}},
        AgentOp.GET_POLICY: {"guest": "t-web"},
        AgentOp.EXPLAIN_POLICY: {"guest": "t-web"},
        AgentOp.CHECK_START: {"guest": "t-web"},
        AgentOp.START_DOMAIN: {"guest": "t-web", "wait": 5},
        AgentOp.STOP_DOMAIN: {"guest": "t-db", "wait": 5},
        AgentOp.SET_POOL: {"dedicated_pool": "4-7"},
        AgentOp.DELETE_POLICY: {"guest": "t-web"},
    }
    order = [AgentOp.PING, AgentOp.SET_POLICY, AgentOp.GET_POLICY, AgentOp.EXPLAIN_POLICY, AgentOp.LIST_POLICIES,
             AgentOp.CPUS, AgentOp.CHECK_START, AgentOp.START_DOMAIN, AgentOp.STOP_DOMAIN, AgentOp.SET_POOL,
             AgentOp.RECONCILE, AgentOp.DELETE_POLICY]
    assert set(order) == set(OPERATIONS)
    for op in order:
        reply = dispatch(a, op.value, bodies.get(op, {}))
        model = OPERATIONS[op].reply
        parsed = model.model_validate(reply)
        assert not parsed.model_extra, f"{op.value} replies fields its model does not name: {parsed.model_extra}"
    for event, body in a.events:
        assert event in EVENTS, f"event {event!r} has no model"
        EVENTS[event].model_validate(body)
