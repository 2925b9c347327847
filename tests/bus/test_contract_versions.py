"""The versioned bus contract: old senders against new readers, and a newer version refused by name.

Version 1 is the unversioned contract: no ``v`` field, an agent's error as
``"code: message"`` text. Everything here runs on a private vhost of the
real RabbitMQ with raw kombu messages shaped exactly like version 1's, so
hosts (agents) and the gateway can be upgraded one at a time.
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
from vmsched.bus.client import AsyncBusClient
from vmsched.bus.connection import BusOptions, ensure_exchanges, open_connection
from vmsched.bus.rpc import call
from vmsched.bus.topology import EXCHANGES, agent_queue, request_queue
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
        q = Queue(reply_queue, exchange="", routing_key=reply_queue, exclusive=True, auto_delete=True)
        with Consumer(c.default_channel, [q], callbacks=[lambda body, m: replies.append(json.loads(m.body))],
                      no_ack=True):
            Producer(c.default_channel).publish(json.dumps(message).encode(), routing_key=queue, exchange="",
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


class OldService:
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
            # an old service's queue, bound to the request exchange as the new gateway binds it (the exchanges are
            # the gateway's): what this checks is the reply, given on the default exchange as version 1 did
            ensure_exchanges(c, EXCHANGES)
            producer = Producer(c.default_channel)

            def answer(body, message) -> None:
                self.requests.append(json.loads(message.body))
                producer.publish(json.dumps(self.reply).encode(), routing_key=message.properties["reply_to"],
                                 exchange="", correlation_id=message.properties["correlation_id"],
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
def old_service(rabbit_vhost: str) -> Iterator:
    services: list[OldService] = []

    def make(reply: dict) -> OldService:
        services.append(OldService(rabbit_vhost, f"test.old.{uuid.uuid4().hex[:8]}", reply))
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


# --- an old sender (gateway or CLI of version 1) against a new agent ----------------------------------
@pytest.mark.rabbitmq
def test_new_agent_answers_a_version_1_request_in_version_1(conn, make_agent, rabbit_vhost: str):
    host = f"hv-v1-{uuid.uuid4().hex[:6]}"
    a = make_agent(host_id=host, transport=open_transport(BusOptions(url=rabbit_vhost)))
    guest(conn, "t-v1")
    agent_answers(rabbit_vhost, host)
    queue = agent_queue(host)

    def v1(op: str, body: dict) -> dict:  # exactly today's (version 1) request: no "v"
        return raw_request(rabbit_vhost, queue, {"op": op, "deadline": time.time() + 10, "body": body})

    ok = v1("set_policy", {"guest": "t-v1", "policy": {"dedicated": 2}})
    assert ok["ok"] is True and ok["error"] is None and ok["body"]["allocation"] == "4-5"
    assert v1("get_policy", {"guest": "t-v1"})["body"]["policy"] == {"dedicated": 2}
    # errors in version 1's words: the code inside the text, no fields a version-1 reader does not know
    missing = v1("get_policy", {"guest": "t-gone"})
    assert set(missing) == {"ok", "error", "body"}
    assert missing["ok"] is False and missing["error"].startswith("not_found: no guest")
    refused = v1("set_policy", {"guest": "t-v1", "policy": {"weight": 1}})
    assert refused["error"].startswith("invalid: weight: weight (cpu_shares) 1 outside")
    bad_name = v1("get_policy", {"guest": "t-v1\x00"})
    assert bad_name["error"].startswith("invalid: guest: guest name contains the control character U+0000")


@pytest.mark.rabbitmq
def test_new_agent_refuses_a_newer_version_by_name(conn, make_agent, rabbit_vhost: str):
    host = f"hv-v3-{uuid.uuid4().hex[:6]}"
    a = make_agent(host_id=host, transport=open_transport(BusOptions(url=rabbit_vhost)))
    agent_answers(rabbit_vhost, host)
    reply = raw_request(rabbit_vhost, agent_queue(host),
                        {"v": CONTRACT_VERSION + 1, "op": "cpus", "deadline": time.time() + 10, "body": {},
                         "something": "new"})
    assert reply["ok"] is False and reply["code"] == "unsupported_version"
    assert f"contract version {CONTRACT_VERSION + 1} is newer" in reply["error"]
    # and it keeps serving
    assert call(rabbit_vhost, agent_queue(host), "cpus", {}, timeout=10)["dedicated_pool"] == "4-7"


# --- a new reader (gateway, CLI) against an old service -------------------------------------------------
@pytest.mark.rabbitmq
def test_new_clients_read_a_version_1_error_reply(rabbit_vhost: str, old_service):
    old = old_service({"ok": False, "error": "invalid: weight: weight (cpu_shares) 1 outside", "body": {}})
    with pytest.raises(RequestError) as sync_error:
        call(rabbit_vhost, old.queue, "set_policy", {"guest": "g"}, timeout=10)
    assert sync_error.value.code == "invalid" and str(sync_error.value) == "weight: weight (cpu_shares) 1 outside"
    assert old.requests[0]["v"] == CONTRACT_VERSION  # what a new sender sends (a v1 reader ignores it)

    async def via_gateway_client() -> RequestError:
        client = AsyncBusClient(BusOptions(url=rabbit_vhost))
        await client.start()
        try:
            with pytest.raises(RequestError) as exc:
                await client.call(old.queue, "set_policy", {"guest": "g"}, 10)
            return exc.value
        finally:
            await client.close()

    error = asyncio.run(via_gateway_client())
    assert error.code == "invalid" and str(error).startswith("weight:")


@pytest.mark.rabbitmq
def test_new_clients_read_a_version_1_success_and_the_agent_client_maps_codes(rabbit_vhost: str, old_service):
    from vmsched.services.policy_agent.errors import GuestNotFound
    from vmsched.services.policy_agent.surfaces.client import call_bus

    ok = old_service({"ok": True, "error": None, "body": {"policies": []}})
    assert call(rabbit_vhost, ok.queue, "list_policies", {}, timeout=10) == {"policies": []}
    host = f"old-{uuid.uuid4().hex[:6]}"
    missing = OldService(rabbit_vhost, agent_queue(host), {"ok": False, "error": "not_found: no guest 'x'", "body": {}})
    try:
        with pytest.raises(GuestNotFound, match="^no guest 'x'$"):
            call_bus(rabbit_vhost, host, AgentOp.GET_POLICY, {"guest": "x"}, timeout=10)
    finally:
        missing.close()


@pytest.mark.rabbitmq
def test_new_clients_refuse_a_newer_reply_by_name(rabbit_vhost: str, old_service):
    newer = old_service({"v": CONTRACT_VERSION + 1, "ok": True, "body": {"whatever": 1}, "shape": "new"})
    with pytest.raises(RequestError, match=f"contract version {CONTRACT_VERSION + 1} is newer") as exc:
        call(rabbit_vhost, newer.queue, "cpus", {}, timeout=10)
    assert exc.value.code == "unsupported_version"


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
