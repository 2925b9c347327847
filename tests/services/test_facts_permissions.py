"""Host facts on least-privilege broker users (deploy/rabbitmq/setup-users.sh), on a private RabbitMQ node.

An agent's facts reach the gateway and the scoring service on their own users
(each replica's own queue, the snapshot request on vmsched.facts); a service
may not publish facts, an agent may not ask for snapshots, and an agent may
not consume another host's snapshot queue.
"""

from __future__ import annotations

from pathlib import Path

import amqp.exceptions
import pytest
from kombu import Consumer, Queue

from tests.support.broker_users import HOSTS, broker, publish, url  # noqa: F401 - the broker fixture
from tests.support.net import free_port
from tests.support.stack import AUTH, Proc, Stack
from tests.support.waiting import wait_until
from vmsched.bus.rabbitmq.connection import open_connection
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import EVENTS_EXCHANGE, FACTS_EXCHANGE

pytestmark = pytest.mark.rabbitmq


@pytest.mark.parametrize("user, exchange, key", [
    ("vmsched-scoring", EVENTS_EXCHANGE, "agent.hv-a.facts"),  # a service cannot forge facts
    ("vmsched-gateway", EVENTS_EXCHANGE, "agent.hv-a.facts"),
    (f"vmsched-agent-{HOSTS[0]}", EVENTS_EXCHANGE, f"agent.{HOSTS[1]}.facts"),  # nor an agent another host's
    (f"vmsched-agent-{HOSTS[0]}", FACTS_EXCHANGE, "snapshot"),  # agents answer snapshot requests, never send them
    ("vmsched-discovery", FACTS_EXCHANGE, "snapshot"),  # discovery keeps no facts
])
def test_facts_publishing_outside_ones_rights_is_refused(broker, user: str, exchange: object, key: str):  # noqa: F811
    _, secrets = broker
    with pytest.raises(amqp.exceptions.AccessRefused):
        publish(secrets, user, exchange, key)


def test_an_agent_cannot_read_another_hosts_snapshot_requests(broker):  # noqa: F811
    _, secrets = broker
    with open_connection(BusOptions(url=url(secrets, f"vmsched-agent-{HOSTS[0]}"))) as conn:
        queue = Queue(f"vmsched.facts.snapshot.{HOSTS[1]}", exchange=FACTS_EXCHANGE, routing_key="snapshot",
                      exclusive=True, auto_delete=True)
        with pytest.raises(amqp.exceptions.AccessRefused):
            Consumer(conn.channel(), [queue]).consume()


def test_facts_flow_on_least_privilege_users(broker, tmp_path: Path):  # noqa: F811
    pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")
    _, secrets = broker
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "guests.py").write_text(
        "from vmsched.plugin import facts\n\n\nclass Guests:\n    def do_score(self, hosts, vm, args):\n"
        "        return [(h, facts.host(h).guests_running if facts.host(h) else -1) for h in hosts]\n")
    port, host = free_port(), HOSTS[0]

    def env(user: str) -> dict[str, str]:
        return {"VMSCHED_AMQP_URL": "", "VMSCHED_AGENT_AMQP": "", "VMSCHED_AMQP_URL_FILE": str(secrets / f"{user}.url")}

    procs = [Proc(["gateway", "--port", str(port)], tmp_path / "gateway.log", env=env("vmsched-gateway")).start(),
             Proc(["scoring", "--plugins", str(plugins), "--pool-size", "1"], tmp_path / "scoring.log",
                  env=env("vmsched-scoring")).start()]
    stack = Stack(port, plugins, procs)
    try:
        stack.wait_ready(queues=("vmsched.filter.v2", "vmsched.score.v2"))
        # the agent starts after the services, with a 10-minute interval: its first collection reaches them
        procs.append(Proc(["agent", "--libvirt", "test:///default", "--host-id", host, "--state-dir",
                           str(tmp_path / "st"), "--socket", str(tmp_path / "agent.sock"), "--facts-interval", "600",
                           "--lock-dir", str(tmp_path / "lock")], tmp_path / "agent.log",
                          env=env(f"vmsched-agent-{host}")).start())
        wait_until(lambda: stack.xmlrpc("runCostFunctions", [["Guests", 1]], [host], "", {})["result"] == [[host, 1]],
                   60, 0.2, "the scoring service to see the agent's facts")
        port2 = free_port()
        fresh = Proc(["gateway", "--port", str(port2)], tmp_path / "gateway2.log", env=env("vmsched-gateway")).start()
        procs.append(fresh)
        second = Stack(port2, plugins, [fresh])
        # the agent's next interval is 10 minutes away: only the snapshot request can warm this replica
        wait_until(lambda: _facts(second, host), 30, 0.1, "a fresh gateway replica warmed by a snapshot")
        logs = "".join(p.output() for p in procs)
        assert "ACCESS_REFUSED" not in logs
    finally:
        stack.stop()


def _facts(stack: Stack, host: str) -> dict | None:
    try:
        r = stack.get(f"/v1/hosts/{host}/facts", headers=AUTH)
    except Exception:  # noqa: BLE001 - not listening yet
        return None
    return r.json() if r.status_code == 200 else None
