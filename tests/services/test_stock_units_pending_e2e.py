"""Pending placements end to end: a burst of starts through XML-RPC, as the engine makes them.

Real gateway and scoring processes on the real RabbitMQ run the stock plugins;
the fake engine (tests/support/fake_engine.py, over HTTPS) gives the engine link the
sizes of the VMs being started, and their CPU pinning policy. The agents'
part is played by a publisher of their facts messages (the memory of the
hosts must be chosen: the test driver's agents all report this machine's).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.support.net import free_port
from tests.support.stack import Proc, Stack, bus_args
from tests.support.waiting import wait_until
from tests.support.facts import facts_message, publish_facts
from tests.support.fake_engine import FakeEngine
from tests.support.tls_certs import make_certs
from vmsched.config import stock_plugins_dir
from vmsched.facts.model import GuestFacts, HostFacts

pytestmark = pytest.mark.rabbitmq

SMALL, BIG = "hv-small", "hv-big"
VM_MIB, FITS = 2048, 3
SMALL_FREE = 321 + FITS * (VM_MIB + 65) + 100  # oVirt's reserve and overhead defaults: room for FITS VMs
BURST = [f"vm-burst-{i}" for i in range(5)]
SEQ = itertools.count(1)


def publish_agents(url: str) -> None:
    """One facts message per agent: the small host has room for FITS VMs, the big one runs 4 guests."""
    seq = next(SEQ)
    busy = [GuestFacts(uuid=f"00000000-0000-0000-0000-00000000000{i}", state="running", memory_mib=512)
            for i in range(4)]
    hosts = ((SMALL, SMALL_FREE, [], 2), (BIG, 64 * 1024, busy, 8))
    publish_facts(url, (facts_message(host, seq, HostFacts(memory_total_mib=free * 2, memory_free_mib=free,
                                                           guests_running=len(guests), threads=1,
                                                           dedicated_pool="8-15", dedicated_pool_cpus=8,
                                                           dedicated_free_cpus=pool_free), guests)
                        for host, free, guests, pool_free in hosts))


@pytest.fixture
def engine(tmp_path: Path):
    fake = FakeEngine(make_certs(tmp_path / "certs")).start()
    for vm in BURST:
        fake.add_vm(vm, VM_MIB, sockets=2)
    fake.add_vm("vm-pinned", 1024, sockets=4, pinning="dedicated")
    yield fake
    fake.stop()


@pytest.fixture
def stack(tmp_path: Path, rabbit_vhost: str, engine: FakeEngine):
    port = free_port()
    common = [*bus_args(tmp_path, rabbit_vhost), "--engine-link-file", str(engine.link_file(tmp_path)),
              "--engine-link-ca", str(engine.certs.ca), "--engine-link-timeout", "2"]
    procs = [Proc(["gateway", "--port", str(port), *common], tmp_path / "gateway.log", env={"VMSCHED_AMQP_URL": ""}),
             Proc(["scoring", "--plugins", str(stock_plugins_dir()), "--pool-size", "1", *common],
                  tmp_path / "scoring.log", env={"VMSCHED_AMQP_URL": ""})]
    s = Stack(port, stock_plugins_dir(), [p.start() for p in procs])
    s.wait_ready(queues=("vmsched.filter.v2", "vmsched.score.v2"))
    yield s
    s.stop()


def test_a_burst_through_xmlrpc_fills_the_small_host_only_up_to_its_room(stack: Stack, rabbit_vhost: str) -> None:
    hosts = [SMALL, BIG]

    def known(vm: str) -> bool:
        """The scoring service's engine link knows the VM (vmsched_DedicatedCpus fails while it does not)."""
        publish_agents(rabbit_vhost)
        reply = stack.xmlrpc("runFilters", ["vmsched_DedicatedCpus"], hosts, vm, {})
        return not reply.get("plugin_errors")

    for vm in [*BURST, "vm-pinned"]:  # filters only: nothing is recorded as placed yet
        wait_until(lambda: known(vm), 30, 0.5, f"the engine link to know {vm}")

    # the engine's dedicated pinning policy: 4 vCPUs need 4 free CPUs of the pool (hv-small has 2)
    assert stack.xmlrpc("runFilters", ["vmsched_DedicatedCpus"], hosts, "vm-pinned", {})["result"] == [BIG]

    chosen = []
    for vm in BURST:  # the facts do not change during the burst
        kept = stack.xmlrpc("runFilters", ["vmsched_Memory"], hosts, vm, {})
        assert kept["result_code"] == 0 and not kept.get("plugin_errors"), kept
        ranked = stack.xmlrpc("runCostFunctions", [["vmsched_EvenGuestDistribution", 1]], kept["result"], vm, {})
        assert not ranked.get("plugin_errors"), ranked
        chosen.append(min(ranked["result"], key=lambda pair: pair[1])[0])  # the engine takes the best weight
    assert chosen == [SMALL] * FITS + [BIG] * (len(BURST) - FITS)
