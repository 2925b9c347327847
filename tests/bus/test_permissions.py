"""Least-privilege broker users (deploy/rabbitmq/setup-users.sh) on a private RabbitMQ node.

Users are global to a broker, so these tests never touch the shared one: a
private node gets the users from the real script, then each component's user
tries what it must not do (ACCESS_REFUSED) and what it must (accepted), and a
whole request path runs on those users: gateway -> scoring -> reply, gateway ->
agent (libvirt test driver) -> reply.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import amqp.exceptions
import httpx
import pytest
from kombu import Consumer, Queue

from tests.support.broker_users import HOSTS, SCRIPT, broker, publish, url  # noqa: F401 - the broker fixture
from tests.support.net import free_port
from tests.support.stack import AUTH, SCORING_QUEUES, SERVICE_QUEUES, Proc, Stack, plugin_copy
from tests.support.waiting import wait_until
from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import AGENT_EXCHANGE, DEAD_EXCHANGE, EXCHANGES, REQUEST_QUEUES, REQUESTS_EXCHANGE, agent_queue, \
    dead_letter_queue, request_queue
from vmsched.messages import Op

pytestmark = pytest.mark.rabbitmq

def test_the_script_keeps_passwords_off_the_command_line_and_out_of_the_definitions(broker):
    node, secrets = broker
    text = SCRIPT.read_text()
    assert "add_user" not in text and "change_password" not in text  # both take the password as an argument
    printed = subprocess.run([str(SCRIPT), "--secrets", str(secrets), "--print"], capture_output=True, text=True,
                             check=True).stdout
    for user in ("vmsched-gateway", "vmsched-scoring", f"vmsched-agent-{HOSTS[0]}"):
        password = (secrets / user).read_text().strip()
        assert len(password) >= 32 and password not in printed
        assert oct((secrets / user).stat().st_mode & 0o777) == "0o600"
    users = node.ctl("list_users").stdout
    assert "guest" not in users.split()  # --delete-guest


@pytest.mark.parametrize("user, exchange, key", [
    ("vmsched-scoring", AGENT_EXCHANGE, HOSTS[0]),  # a service publishing an agent request
    ("vmsched-scoring", "", agent_queue(HOSTS[0])),  # ... or straight to the agent's queue by name
    ("vmsched-scoring", REQUESTS_EXCHANGE, "vmsched.balance.v2"),  # ... or a scheduling request
    (f"vmsched-agent-{HOSTS[0]}", AGENT_EXCHANGE, HOSTS[1]),  # an agent asking another host's agent
    (f"vmsched-agent-{HOSTS[0]}", "", agent_queue(HOSTS[1])),
    ("vmsched-gateway", "", agent_queue(HOSTS[0])),  # nobody writes to the default exchange
])
def test_publishing_outside_ones_rights_is_refused(broker, user: str, exchange: object, key: str):
    _, secrets = broker
    with pytest.raises(amqp.exceptions.AccessRefused, match="ACCESS_REFUSED"):
        publish(secrets, user, exchange, key)


def test_the_gateway_may_publish_agent_and_scheduling_requests(broker):
    _, secrets = broker
    publish(secrets, "vmsched-gateway", AGENT_EXCHANGE, HOSTS[1])
    publish(secrets, "vmsched-gateway", REQUESTS_EXCHANGE, "vmsched.score.v2")


def test_an_agent_reads_only_its_own_queue_and_key(broker):
    _, secrets = broker
    a, b = HOSTS
    with open_connection(BusOptions(url=url(secrets, f"vmsched-agent-{a}"))) as conn:
        request_queue(agent_queue(a))(conn.channel()).declare()  # its own: fine
    for queue in (request_queue(agent_queue(b)),  # another host's queue
                  Queue(agent_queue(a), exchange=AGENT_EXCHANGE, routing_key=b, durable=False),  # its queue, another host's key
                  Queue(agent_queue(a), exchange=AGENT_EXCHANGE, routing_key="#", durable=False)):  # ... or every key
        with open_connection(BusOptions(url=url(secrets, f"vmsched-agent-{a}"))) as conn:
            with pytest.raises(amqp.exceptions.AccessRefused):
                queue(conn.channel()).declare()


def test_a_service_cannot_consume_another_services_queue(broker):
    _, secrets = broker
    with open_connection(BusOptions(url=url(secrets, "vmsched-scoring"))) as conn:
        with pytest.raises(amqp.exceptions.AccessRefused):
            Consumer(conn.channel(), [request_queue("vmsched.balance.v2")]).consume()


def test_a_service_consumes_its_dead_letters_and_no_one_elses(broker):
    _, secrets = broker
    with open_connection(BusOptions(url=url(secrets, "vmsched-gateway"))) as conn:
        ensure_exchanges(conn, EXCHANGES)  # as the gateway does (vmsched.dead among them)
        request_queue(REQUEST_QUEUES[Op.SCORE])(conn.channel()).declare()  # quorum, dead-lettering to vmsched.dead
    with open_connection(BusOptions(url=url(secrets, "vmsched-scoring"))) as conn:
        for name in SERVICE_QUEUES["scoring"]:
            Consumer(conn.channel(), [dead_letter_queue(name), request_queue(name)]).consume()
    with open_connection(BusOptions(url=url(secrets, "vmsched-scoring"))) as conn:
        with pytest.raises(amqp.exceptions.AccessRefused):
            Consumer(conn.channel(), [dead_letter_queue(REQUEST_QUEUES[Op.BALANCE])]).consume()
    with pytest.raises(amqp.exceptions.AccessRefused, match="ACCESS_REFUSED"):  # nobody else answers them
        publish(secrets, "vmsched-agent-" + HOSTS[0], DEAD_EXCHANGE, REQUEST_QUEUES[Op.SCORE])


def test_a_whole_request_path_on_least_privilege_users(broker, tmp_path: Path):
    pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")
    _, secrets = broker
    plugins = plugin_copy(tmp_path)
    port, host = free_port(), HOSTS[0]

    def env(user: str) -> dict[str, str]:
        return {"VMSCHED_AMQP_URL": "", "VMSCHED_AGENT_AMQP": "", "VMSCHED_AMQP_URL_FILE": str(secrets / f"{user}.url")}

    procs = [Proc(["gateway", "--port", str(port), "--request-timeout", "20"], tmp_path / "gateway.log",
                  env=env("vmsched-gateway")).start()]
    for name in ("discovery", "scoring"):
        procs.append(Proc([name, "--plugins", str(plugins), "--pool-size", "1"], tmp_path / f"{name}.log",
                          env=env(f"vmsched-{name}")).start())
    procs.append(Proc(["agent", "--libvirt", "test:///default", "--host-id", host, "--state-dir", str(tmp_path / "st"),
                       "--socket", str(tmp_path / "agent.sock"), "--dedicated-pool", "6-7",
                       "--lock-dir", str(tmp_path / "lock")], tmp_path / "agent.log",
                      env=env(f"vmsched-agent-{host}")).start())
    stack = Stack(port, plugins, procs)
    try:
        stack.wait_ready(queues=SCORING_QUEUES)
        hosts = ["h0", "h1", "h2", "h3"]
        assert stack.xmlrpc("runFilters", ["KeepEven"], hosts, "vm", {})["result"] == ["h0", "h2"]
        r = wait_until(lambda: (r := _get(f"{stack.url}/v1/hosts/{host}/cpus")) is not None and r.status_code == 200
                       and r, 60, 0.2, "the agent to answer through the gateway")
        assert "6-7" in r.text
        logs = "".join(p.output() for p in procs)
        assert "ACCESS_REFUSED" not in logs
        for user in ("vmsched-gateway", "vmsched-scoring", f"vmsched-agent-{host}"):
            assert (secrets / user).read_text().strip() not in logs  # never a password in a log line
    finally:
        stack.stop()


def _get(address: str) -> httpx.Response | None:
    try:
        return httpx.get(address, timeout=5, headers=AUTH)
    except httpx.HTTPError:
        return None


def test_the_script_refuses_a_bad_host_id(tmp_path: Path):
    out = subprocess.run([str(SCRIPT), "--secrets", str(tmp_path), "--agent", "#", "--print"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "host ID" in out.stderr
