"""The decision log on least-privilege broker users (deploy/rabbitmq/setup-users.sh), on a private RabbitMQ node.

Gateway replicas on the vmsched-gateway user ask each other for decisions on
vmsched.events (gateway.decisions.query / .answer.<token> / .presence); no
other component may speak there, and nothing else is a decision key.
"""

from __future__ import annotations

import asyncio

import amqp.exceptions
import pytest

from tests.support.broker_users import HOSTS, broker, publish, url  # noqa: F401 - the broker fixture
from tests.support.waiting import wait_until
from vmsched.bus.options import BusOptions
from vmsched.bus.transport import open_transport
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.gateway.decisions.log import DecisionLog
from vmsched.decide.rules import filter_decision
from vmsched.messages import FilterOutcome, FilterRequest

pytestmark = pytest.mark.rabbitmq


@pytest.mark.parametrize("user, key", [
    ("vmsched-scoring", "gateway.decisions.query"),  # only gateways ask or answer gateways
    ("vmsched-scoring", "gateway.decisions.answer.0123456789ab"),
    (f"vmsched-agent-{HOSTS[0]}", "gateway.decisions.presence"),
    ("vmsched-gateway", "gateway.gw-a.decision"),  # the first release's push: no longer a key
    ("vmsched-gateway", "gateway.decisions.answer.not-a-token"),
    ("vmsched-gateway", "gateway.decisions.other"),
])
def test_decision_messages_outside_ones_rights_are_refused(broker, user: str, key: str):  # noqa: F811
    _, secrets = broker
    with pytest.raises(amqp.exceptions.AccessRefused):
        publish(secrets, user, EVENTS_EXCHANGE, key)


def test_gateway_replicas_ask_each_other_on_the_gateway_user(broker):  # noqa: F811
    _, secrets = broker
    publish(secrets, "vmsched-gateway", EVENTS_EXCHANGE, "gateway.decisions.presence")  # accepted
    options = BusOptions(url=url(secrets, "vmsched-gateway"), connect_timeout=2.0)
    a, b = DecisionLog(5, "gw-a", bus=open_transport(options)), DecisionLog(5, "gw-b", bus=open_transport(options))
    for log in (a, b):
        log.start()
    try:
        for log in (a, b):
            assert log.peers is not None
            wait_until(lambda: len(log.peers.peers()) == 1, 20, 0.05, f"{log.gateway} to know the other")
        outcomes = [FilterOutcome(unit="A", ok=True, hosts=["h1"])]
        a.submit("filter", FilterRequest(units=["A"], hosts=["h1", "h2"], vm="v"),
                 filter_decision(["h1", "h2"], outcomes), outcomes, False, 0.01)
        found = asyncio.run(b.search(5))
        assert [r["gateway"] for r in found.records] == ["gw-a"] and not found.missing
    finally:
        for log in (a, b):
            log.stop()
