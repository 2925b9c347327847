"""Shadow comparisons on least-privilege broker users (deploy/rabbitmq/setup-users.sh), on a private RabbitMQ node.

The scoring and balancer users publish comparisons under their own ``shadow.<service>`` key only; nobody else
speaks there; a gateway on its own user binds ``shadow.*`` and keeps what a real shadow candidate published.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import amqp.exceptions
import pytest

from tests.support.broker_users import HOSTS, broker, publish, url  # noqa: F401 - the broker fixture
from tests.support.paths import TEST_PLUGINS
from tests.support.waiting import wait_until
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.bus.transport import open_transport
from vmsched.gateway.decisions.shadow import ShadowStore
from vmsched.messages import FilterOutcome
from vmsched.runtime.types import Confinement, Limits
from vmsched.whatif.replay import Policy
from vmsched.whatif.shadow import Shadow, ShadowCall

pytestmark = pytest.mark.rabbitmq


@pytest.mark.parametrize("user, key", [
    ("vmsched-scoring", "shadow.balancer"),  # a service speaks for itself only
    ("vmsched-balancer", "shadow.scoring"),
    ("vmsched-discovery", "shadow.discovery"),  # it runs no unit
    (f"vmsched-agent-{HOSTS[0]}", "shadow.scoring"),
    ("vmsched-gateway", "shadow.scoring"),
])
def test_shadow_comparisons_outside_ones_rights_are_refused(broker, user: str, key: str):  # noqa: F811
    _, secrets = broker
    with pytest.raises(amqp.exceptions.AccessRefused):
        publish(secrets, user, EVENTS_EXCHANGE, key)


@pytest.mark.parametrize("service", ["scoring", "balancer"])
def test_a_service_may_publish_its_comparisons(broker, service: str):  # noqa: F811
    _, secrets = broker
    publish(secrets, f"vmsched-{service}", EVENTS_EXCHANGE, f"shadow.{service}")  # accepted


def test_a_gateway_keeps_what_a_shadow_on_the_scoring_user_published(broker, tmp_path: Path):  # noqa: F811
    _, secrets = broker
    store = ShadowStore(open_transport(BusOptions(url=url(secrets, "vmsched-gateway"), connect_timeout=2.0)))
    store.start()
    candidate = tmp_path / "candidate"
    shutil.copytree(TEST_PLUGINS, candidate, ignore=shutil.ignore_patterns("__pycache__"))
    scoring = open_transport(BusOptions(url=url(secrets, "vmsched-scoring"), connect_timeout=2.0))
    policy = Policy(candidate, Limits(), Confinement(allow_root=True), 1, lambda _unit: 5.0, name="shadow-test")
    shadow = Shadow(policy, "scoring", scoring.events("scoring")).start()
    try:
        wait_until(store.ready.is_set, 20, 0.05, "the gateway's shadow subscription")
        hosts = ["h1", "h2", "h3"]
        call_id = uuid.uuid4().hex
        live = [FilterOutcome(unit="KeepAllButLast", ok=True, hosts=hosts)]  # live kept every host
        shadow.offer(ShadowCall(call_id, "filter", hosts, "vm", {}, [("KeepAllButLast", 1)], None, live))
        found = wait_until(lambda: store.get(call_id), 20, 0.05, "the comparison at the gateway")
        assert found.service == "scoring" and found.status == "changed" and "drops h3" in found.what
        assert [row.host for row in found.rows] == ["h3"] and found.rows[0].candidate["result"] == "dropped"
    finally:
        shadow.stop()
        store.stop()
