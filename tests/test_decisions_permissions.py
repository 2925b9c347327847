"""The decision log on least-privilege broker users (deploy/rabbitmq/setup-users.sh), on a private RabbitMQ node.

Two gateway replicas on the vmsched-gateway user share their decisions on
vmsched.events (gateway.<id>.decision); no other component may publish one.
"""

from __future__ import annotations

import amqp.exceptions
import pytest

from tests.conftest import wait_until
from tests.test_bus_permissions import HOSTS, broker, publish, url  # noqa: F401 - the broker fixture
from vmsched.bus.connection import BusOptions
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.gateway.decision_log import DecisionLog
from vmsched.gateway.render import filter_decision
from vmsched.messages import FilterOutcome, FilterRequest


@pytest.mark.parametrize("user, key", [
    ("vmsched-scoring", "gateway.gw-a.decision"),  # only gateways speak for gateways
    (f"vmsched-agent-{HOSTS[0]}", "gateway.gw-a.decision"),
    ("vmsched-gateway", "gateway.gw-a.other"),  # and only decisions
    ("vmsched-gateway", "gateway.gw.a.decision"),
])
def test_decision_publishing_outside_ones_rights_is_refused(broker, user: str, key: str):  # noqa: F811
    _, secrets = broker
    with pytest.raises(amqp.exceptions.AccessRefused):
        publish(secrets, user, EVENTS_EXCHANGE, key)


def test_gateway_replicas_share_decisions_on_the_gateway_user(broker):  # noqa: F811
    _, secrets = broker
    publish(secrets, "vmsched-gateway", EVENTS_EXCHANGE, "gateway.gw-a.decision")  # accepted
    options = BusOptions(url=url(secrets, "vmsched-gateway"), connect_timeout=2.0)
    a, b = DecisionLog(5, "gw-a", bus=options), DecisionLog(5, "gw-b", bus=options)
    for log in (a, b):
        log.start()
    try:
        for log in (a, b):
            assert log.subscriber is not None
            wait_until(log.subscriber.ready.is_set, 20, 0.05, "the decision subscription")
        outcomes = [FilterOutcome(unit="A", ok=True, hosts=["h1"])]
        a.submit("filter", FilterRequest(units=["A"], hosts=["h1", "h2"], vm="v"),
                 filter_decision(["h1", "h2"], outcomes), outcomes, False, 0.01)
        wait_until(lambda: len(b.ring) == 1, 20, 0.05, "gw-a's decision in gw-b's ring")
        assert b.ring.recent()[0]["gateway"] == "gw-a"
    finally:
        for log in (a, b):
            log.stop()
