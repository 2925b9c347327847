"""Stock units end to end: real agents' facts, through XML-RPC as the engine calls them.

Two policy agents on libvirt's test driver publish facts on the real RabbitMQ;
the gateway, the scoring and the balancer services run the stock plugins (the
default plugins folder). One filter (vmsched_MaxVms), one weight and one
balancer (vmsched_EvenGuestDistribution) decide from those facts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.net import free_port
from tests.support.stack import Proc, Stack, bus_args
from tests.support.waiting import wait_until
from tests.services.test_facts_bus import facts_of
from tests.support.agents import agent

pytestmark = pytest.mark.rabbitmq

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")

HOSTS = ["hv-busy", "hv-idle"]


@pytest.fixture
def stack(tmp_path: Path, rabbit_vhost: str):
    port = free_port()
    common = [*bus_args(tmp_path, rabbit_vhost), "--facts-max-age", "5"]
    procs = [Proc(["gateway", "--port", str(port), *common], tmp_path / "gateway.log", env={"VMSCHED_AMQP_URL": ""}),
             Proc(["scoring", "--pool-size", "2", *common], tmp_path / "scoring.log", env={"VMSCHED_AMQP_URL": ""}),
             Proc(["balancer", "--pool-size", "1", *common], tmp_path / "balancer.log", env={"VMSCHED_AMQP_URL": ""})]
    s = Stack(port, Path("."), [p.start() for p in procs])
    s.wait_ready(queues=("vmsched.filter.v2", "vmsched.score.v2", "vmsched.balance.v2"))
    s.procs += [agent(tmp_path, rabbit_vhost, "hv-busy", [("b1", 512), ("b2", 128), ("b3", 512), ("b4", 512)]),
                agent(tmp_path, rabbit_vhost, "hv-idle", [("i1", 256)])]
    wait_until(lambda: all(facts_of(s, h) for h in HOSTS), 30, 0.1, "facts of both agents")
    yield s
    s.stop()


def test_stock_filter_weight_and_balancer_decide_from_live_facts(stack: Stack):
    # wait until the services' caches hold both hosts (the weight scores only hosts with fresh facts)
    def weights() -> dict[str, int]:
        reply = stack.xmlrpc("runCostFunctions", [["vmsched_EvenGuestDistribution", 1]], HOSTS, "", {})
        assert reply["result_code"] == 0, reply
        return dict(reply["result"])

    wait_until(lambda: weights() == {"hv-busy": 4, "hv-idle": 1}, 20, 0.2, "weights from both agents' guest counts")

    kept = stack.xmlrpc("runFilters", ["vmsched_MaxVms"], HOSTS, "", {"MaxVmCount": "3"})
    assert kept["result"] == ["hv-idle"] and kept["result_code"] == 0
    assert stack.xmlrpc("runFilters", ["vmsched_MaxVms"], HOSTS, "", {})["result"] == HOSTS  # default 100

    small = next(g["uuid"] for g in facts_of(stack, "hv-busy")["guests"] if g["name"] == "b2")
    move = stack.xmlrpc("runLoadBalancing", "vmsched_EvenGuestDistribution", HOSTS,
                        {"HighVmCount": "3", "MigrationThreshold": "2"})
    assert move["result"] == [small, ["hv-idle"]] and move["result_code"] == 0  # the smallest guest, to the idle host
    calm = stack.xmlrpc("runLoadBalancing", "vmsched_EvenGuestDistribution", HOSTS, {})  # 4 <= HighVmCount 10
    assert calm["result"] == ["", []]
