"""Dedicated pools and a second agent on a real libvirtd with QEMU guests, seen at the OS level.

- a pool change that conflicts with a guest's explicit pins is refused naming the guest, so two
   guests can no longer end up on one dedicated CPU; a guest pinned onto a dedicated CPU by its
   manager is reported (reconcile, metric, error state), its threads left where its manager put them.
- a second agent on the same libvirtd refuses to start and names the first; no sequence of
   repairs writes a duplicated element into a domain's XML.
On this 2-CPU machine: pool = {hi}, shared = the rest.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt


def test_pool_change_conflicting_with_a_pin_is_refused_and_overlaps_are_reported(env, guests, agent_factory):
    import libvirt

    hi = max(env.host_cpus)
    pool = frozenset({hi})
    agent = agent_factory(dedicated_pool="none", reconcile_interval=3600)
    a = guests.define(vcpus=1)
    ga = guests.start(a)
    agent.cli("policy", "set", a, "--pin", f"0={hi}")
    h.wait_for(ga.vcpu_pins, {0: pool}, what=f"{a}'s vCPU on CPU {hi}")
    # the reproduction of the bug: this pool change was accepted, and a second guest then got CPU hi
    proc = agent.cli("policy", "pool", str(hi), check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"dedicated pool {hi} refused" in proc.stderr and f"guest '{a}': vCPU 0 pin {hi}" in proc.stderr
    assert agent.request("cpus")["dedicated_pool"] == ""
    b = guests.define(vcpus=1)
    proc = agent.cli("policy", "set", b, "--dedicated", "1", check=False)
    assert proc.returncode == 1 and "no dedicated pool" in proc.stderr
    agent.cli("policy", "delete", a)

    # with the pool set, a guest pinned onto the dedicated CPU by its manager (own <cputune>, no
    # vmsched policy) is reported, not fought
    agent.cli("policy", "pool", str(hi))
    agent.cli("policy", "set", b, "--dedicated", "1")
    gb = guests.start(b)
    h.wait_for(gb.vcpu_pins, {0: pool}, what=f"{b}'s dedicated vCPU")
    m = guests.define(vcpus=1)
    dom = guests.dom(m)
    # the agent confines the new guest's definition to the shared set; its manager then edits the definition,
    # its own <cputune> for the agent's (a define racing the agent's repair: test_e2e_concurrent_define.py)
    inactive = libvirt.VIR_DOMAIN_XML_INACTIVE
    h.wait_until(lambda: "<emulatorpin" in dom.XMLDesc(inactive), what=f"the agent's confinement of {m}")
    env.conn.defineXML(h.with_cputune(dom.XMLDesc(inactive), f"<vcpupin vcpu='0' cpuset='{hi}'/>"))
    gm = guests.start(m)
    message = f"dedicated CPUs {hi} of guest '{b}' are shared with guest '{m}' (vcpu0 on {hi}, emulator on {hi})"
    # the agent may still be handling the start event of the manager's guest when the first sweep runs:
    # the overlap is reported by the sweep that follows it
    summary = h.wait_until(lambda: s if message in (s := agent.cli_json("policy", "reconcile"))["errors"] else None,
                           interval=0.5, what="the overlap reported by a sweep")
    assert message in summary["errors"], summary
    assert agent.metric("vmsched_agent_dedicated_overlaps") == 1
    assert agent.metric("vmsched_agent_foreign_pins_in_pool") == 1
    view = agent.cli_json("policy", "get", b, "--json")
    assert view["status"] == "error" and message in view["error"], view
    assert gm.vcpu_pins() == {0: pool}, "the manager's pin is left alone"
    assert "vcpu0 on" in agent.cli_json("policy", "get", m, "--json")["error"]


def test_second_agent_on_the_same_libvirtd_refuses_to_start(env, agent_factory):
    first = agent_factory(host_id="e2e-first")
    second = agent_factory(host_id="e2e-second", start=False)  # its own state dir and socket
    with pytest.raises(h.AgentError) as exc:
        second.start(timeout=60)
    log = second.log_tail(20)
    assert "another vmsched agent already manages the libvirtd of this machine" in log, str(exc.value)
    assert f"pid {first.pid}" in log and "host_id e2e-first" in log and f"state_dir {first.state_dir}" in log
    assert second.proc is not None and second.proc.returncode == 1
    assert first.request("ping")["connected"]


def _counts(xml: str) -> Counter:
    root = ET.fromstring(xml)
    c: Counter = Counter()
    tune = root.find("cputune")
    if tune is not None:
        c.update(f"vcpupin {p.get('vcpu')}" for p in tune.findall("vcpupin"))
        c.update("emulatorpin" for _ in tune.findall("emulatorpin"))
    meta = root.find("metadata")
    if meta is not None:
        c.update(child.tag for child in meta)
    return c


def test_alternating_repairs_never_duplicate_an_element(env, guests):
    """Two writers that disagree (what two agents did) re-pin one guest back and forth, config and
    live, metadata and pins; the persistent XML never holds an element twice."""
    from vmsched.services.policy_agent.policy.model import GuestPolicy
    from vmsched.services.policy_agent.policy.validation import Desired
    from vmsched.services.policy_agent.virt import metadata
    from vmsched.services.policy_agent.virt.apply import Applier, Caps
    from vmsched.services.policy_agent.virt.host import read_topology

    import libvirt

    name = guests.define(vcpus=2)
    dom = guests.dom(name)
    env.conn.defineXML(dom.XMLDesc(0).replace("<vcpu placement='static'>2</vcpu>",
                                              "<vcpu placement='static' cpuset='0'>2</vcpu>"))
    guests.start(name)
    caps = Caps.detect(env.conn)
    topology = read_topology(env.conn)
    cpus, ncpus = topology.online, topology.cpumap_length
    applier = Applier(caps, ncpus, cpus)
    lo, hi = min(cpus), max(cpus)
    sides = [
        (Desired({0: frozenset({lo}), 1: frozenset(cpus)}, frozenset({lo}), {}), GuestPolicy(vcpu_pins={0: str(lo)})),
        (Desired({0: frozenset({hi}), 1: frozenset({hi})}, frozenset(cpus), {}), GuestPolicy(dedicated=1)),
    ]
    for i in range(40):
        desired, policy = sides[i % 2]
        dom = guests.dom(name)
        metadata.write(dom, policy, metadata.AllocationHint(f"agent{i % 2}", frozenset({hi}), frozenset({hi})))
        applier.verify_and_repair(dom, desired, active=True, persistent=True)
        for flags in (libvirt.VIR_DOMAIN_XML_INACTIVE, 0):
            dup = {k: n for k, n in _counts(dom.XMLDesc(flags)).items() if n > 1}
            assert not dup, f"round {i}: duplicated elements {dup} in\n{dom.XMLDesc(flags)}"
