"""Dedicated placement on real QEMU, for what the machine's CPUs allow: memory bound to the guest's NUMA node
(numa strict) and the emulator threads on a dedicated CPU of their own (emulator isolate)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt

INACTIVE = 2  # VIR_DOMAIN_XML_INACTIVE


def numatune(dom, flags: int = 0) -> tuple[str | None, str | None]:
    memory = ET.fromstring(dom.XMLDesc(flags)).find("numatune/memory")
    return (None, None) if memory is None else (memory.get("mode"), memory.get("nodeset"))


def mems_allowed(pid: int) -> str:
    text = open(f"/proc/{pid}/status").read()
    return re.search(r"^Mems_allowed_list:\s*(\S+)", text, re.M).group(1)


def test_numa_strict_binds_the_memory_to_the_node_of_the_cpus(env, guests, agent_factory):
    if len(env.host_cpus) < 2:
        pytest.skip(f"needs 2 host CPUs (one dedicated, one shared), found {sorted(env.host_cpus)}")
    hi = max(env.host_cpus)
    agent = agent_factory(dedicated_pool=str(hi))
    name = guests.define(vcpus=1)
    g = guests.start(name)
    view = agent.request("set_policy", {"guest": name, "policy": {"dedicated": 1, "numa": "strict"}})
    node = view["desired"]["memory_nodes"]
    assert view["allocation"] == str(hi) and node is not None
    dom = guests.dom(name)
    assert numatune(dom, INACTIVE) == ("strict", node)  # the definition: in force from the next start
    # live where libvirt allows it, else the agent says it applies at the next start
    live = numatune(dom)
    deferred = [w for w in view["warnings"] if "at the next start" in w]
    assert live == ("strict", node) or deferred, (live, view["warnings"])
    h.wait_for(g.vcpu_pins, {0: frozenset({hi})}, what="the vCPU on its dedicated CPU")
    guests.destroy(name)
    g = guests.start(name)  # from the definition: bound from the first instruction
    assert numatune(guests.dom(name)) == ("strict", node)
    assert mems_allowed(g.pid()) == node
    assert g.vcpu_pins() == {0: frozenset({hi})}
    assert agent.request("reconcile")["repaired"] == 0


def test_emulator_isolate_puts_the_emulator_threads_on_their_own_cpu(env, guests, agent_factory):
    cpus = sorted(env.host_cpus)
    if len(cpus) < 3:
        pytest.skip(f"needs 3 host CPUs (a dedicated vCPU, the emulator's own CPU, a shared one), found {cpus}")
    pool = cpus[-2:]
    agent = agent_factory(dedicated_pool=f"{pool[0]},{pool[1]}")
    name = guests.define(vcpus=1)
    agent.request("set_policy", {"guest": name, "policy": {"dedicated": 1, "emulator": "isolate"}})
    g = guests.start(name)
    vcpu_cpu, emulator_cpu = pool
    h.wait_for(g.vcpu_pins, {0: frozenset({vcpu_cpu})}, what="the vCPU on its dedicated CPU")
    emulators = g.emulator_pins()
    assert emulators and all(c == frozenset({emulator_cpu}) for c in emulators.values()), h.fmt_pins(emulators)
    other = guests.define(vcpus=1)
    o = guests.start(other)
    h.wait_for(lambda: o.all_thread_cpus(), frozenset(cpus[:-2]), what="another guest off both dedicated CPUs")
