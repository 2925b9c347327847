"""The engine link end to end: real gateway and scoring processes on the real RabbitMQ, the fake engine over HTTPS.

The engine sends its own host IDs (E-big, E-small) and a VM being started.
Each process's engine link maps the host IDs to the agents by ``hw_id`` (the
agents' vdsm IDs) and fetches the VM's memory and vCPUs; through XML-RPC a
filter then keeps the host whose free memory holds the VM, and a weight sees
the VM's memory. Until the link knows the VM, the unit says so in its error
and drops no host.

The agents' part is played by a publisher of their facts messages on the bus:
libvirt's test driver reports no host UUID and this machine has no
/etc/vdsm/vdsm.id, so a real agent here has no identity the engine could know.
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
from vmsched.facts.model import HostFacts

pytestmark = pytest.mark.rabbitmq

PLUGIN = '''
from vmsched.plugin import facts


def _need(vm):
    need = facts.vm()
    if need is None:
        raise LookupError(f"memory of VM {vm} unknown, no host dropped: {facts.vm_problem()}")
    return need


class VmFits:
    """Keeps the hosts whose free memory holds the VM."""

    def do_filter(self, hosts, vm, args):
        need = _need(vm)
        return [h for h in hosts if (f := facts.host(h)) is not None and f.memory_free_mib >= need.memory_mib]


class VmSize:
    """Every host weighs the VM's memory in MiB times 10 plus its vCPUs (what the unit saw)."""

    def do_score(self, hosts, vm, args):
        need = _need(vm)
        return [(h, need.memory_mib * 10 + need.vcpus) for h in hosts]


class VmSource:
    """Every host weighs 1 when the VM's size came from the engine, 2 when from its host's facts."""

    def do_score(self, hosts, vm, args):
        return [(h, 1 if _need(vm).source == "engine" else 2) for h in hosts]
'''
AGENTS = {"hv-big": ("3f6c1a52-0000-4000-8000-0000000000b1", 8192),
          "hv-small": ("3f6c1a52-0000-4000-8000-0000000000b2", 1024)}
ENGINE_HOSTS = {"E-big": "hv-big", "E-small": "hv-small"}
SEQ = itertools.count(1)


def publish_agents(url: str) -> None:
    """One facts message per agent, as an agent sends it (its own routing key)."""
    seq = next(SEQ)
    publish_facts(url, (facts_message(host, seq, HostFacts(vdsm_id=vdsm_id, memory_total_mib=free * 2,
                                                           memory_free_mib=free))
                        for host, (vdsm_id, free) in AGENTS.items()))


@pytest.fixture
def engine(tmp_path: Path):
    fake = FakeEngine(make_certs(tmp_path / "certs")).start()
    for engine_id, agent in ENGINE_HOSTS.items():
        fake.add_host(engine_id, AGENTS[agent][0].upper())
    fake.add_vm("vm-new", 3072, sockets=2, cores=2, threads=1)
    yield fake
    fake.stop()


@pytest.fixture
def stack(tmp_path: Path, rabbit_vhost: str, engine: FakeEngine):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "vm_size.py").write_text(PLUGIN)
    port = free_port()
    common = [*bus_args(tmp_path, rabbit_vhost), "--engine-link-file", str(engine.link_file(tmp_path)),
              "--engine-link-ca", str(engine.certs.ca), "--engine-link-timeout", "2"]
    procs = [Proc(["gateway", "--port", str(port), *common], tmp_path / "gateway.log", env={"VMSCHED_AMQP_URL": ""}),
             Proc(["scoring", "--plugins", str(plugins), "--pool-size", "1", *common], tmp_path / "scoring.log",
                  env={"VMSCHED_AMQP_URL": ""})]
    s = Stack(port, plugins, [p.start() for p in procs])
    s.wait_ready(queues=("vmsched.filter.v2", "vmsched.score.v2"))
    yield s
    s.stop()


def test_units_see_the_engine_link_through_xmlrpc(stack: Stack, engine: FakeEngine, rabbit_vhost: str) -> None:
    def mapped() -> bool:
        publish_agents(rabbit_vhost)  # again until the gateway's cache has them and its link mapped them
        r = stack.get("/v1/hosts/E-big/facts")
        return r.status_code == 200 and r.json()["agent_host_id"] == "hv-big"

    wait_until(mapped, 30, 0.5, "the gateway's engine link to map E-big")
    view = stack.get("/v1/hosts/E-big/facts").json()
    assert "mapped by the engine link" in view["source"] and view["host"]["memory_free_mib"] == 8192
    missing = stack.get("/v1/hosts/E-unknown/facts")
    assert missing.status_code == 404 and "no facts" in missing.text

    hosts = list(ENGINE_HOSTS)
    # the scoring service's link was never asked about vm-new: the first call waits (--engine-link-wait,
    # 0.5 s by default) for the engine's answer, so the engine's first call about a starting VM sees its size
    first = stack.xmlrpc("runCostFunctions", [["VmSize", 1]], hosts, "vm-new", {})
    assert not first.get("plugin_errors") and dict(first["result"]) == {h: 3072 * 10 + 4 for h in hosts}, first
    absent = stack.xmlrpc("runFilters", ["VmFits"], hosts, "vm-absent", {})  # a VM the engine does not know
    assert absent["result"] == hosts and "knows no such VM" in str(absent.get("plugin_errors")), absent  # none dropped

    def filtered() -> list[str]:
        return stack.xmlrpc("runFilters", ["VmFits"], hosts, "vm-new", {})["result"]

    wait_until(lambda: filtered() == ["E-big"], 30, 0.5, "the filter to keep the host that holds the VM's 3 GiB")
    scored = stack.xmlrpc("runCostFunctions", [["VmSize", 1]], hosts, "vm-new", {})
    assert not scored.get("plugin_errors") and dict(scored["result"]) == {h: 3072 * 10 + 4 for h in hosts}, scored
    assert engine.calls["/ovirt-engine/api/vms/vm-new"] <= 2  # one per process: answers are cached
    logs = "".join(p.output() for p in stack.procs)
    assert "engine link to https://localhost" in logs and engine.password not in logs
