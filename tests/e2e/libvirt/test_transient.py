"""Transient guests (createXML, as oVirt's vdsm starts them) get their policy at every start, from the
agent's store: after destroy + createXML again, and across an agent restart. Checked at the OS level."""

from __future__ import annotations

import uuid as uuidlib

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt


def _create(env, name: str, uid: str) -> h.OSGuest:
    xml = h.guest_xml(name, vcpus=2).replace("<name>", f"<uuid>{uid}</uuid>\n  <name>", 1)
    dom = env.conn.createXML(xml, 0)
    assert not dom.isPersistent()
    g = h.OSGuest(name)
    h.wait_until(lambda: g.running() and len(g.vcpus()) == 2, timeout=30, what=f"QEMU of transient {name}")
    return g


def _destroy(env, name: str) -> None:
    env.conn.lookupByName(name).destroy()
    h.wait_until(lambda: not h.OSGuest(name).running(), timeout=30, what=f"{name}'s QEMU to exit")


def test_transient_guest_gets_its_policy_at_every_start(env, guests, agent_factory):
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    want = {0: frozenset({hi}), 1: frozenset({lo})}
    name, uid = f"{h.PREFIX}transient", str(uuidlib.uuid4())
    guests.names.append(name)  # removed at teardown whatever happens
    agent = agent_factory()
    g = _create(env, name, uid)
    agent.cli("policy", "set", name, "--pin", f"0={hi}", "--pin", f"1={lo}", "--weight", "700")
    h.wait_for(g.vcpu_pins, want, what="pins of the running transient guest")
    assert g.shares() == 700

    # destroyed: the guest and its metadata are gone; the policy is listed from the store
    _destroy(env, name)
    h.wait_until(lambda: {p["uuid"]: p["state"] for p in agent.request("list_policies")["policies"]}.get(uid)
                 == "absent", what="the stored policy listed as absent")

    # created again with the same UUID and no policy in its XML: the agent applies the stored one
    g = _create(env, name, uid)
    h.wait_for(g.vcpu_pins, want, what="pins after createXML again")
    h.wait_until(lambda: g.shares() == 700, what="weight after createXML again")
    assert "<vmsched:policy" in h.virsh("dumpxml", name, check=True).stdout
    assert agent.request("get_policy", {"guest": uid})["status"] == "applied"

    # agent down while the guest is re-created: it starts unpinned; the restarted agent applies it
    agent.stop()
    _destroy(env, name)
    g = _create(env, name, uid)
    assert g.vcpu_pins() != want, "without the agent nothing pins a transient guest"
    agent.start()
    h.wait_for(g.vcpu_pins, want, what="pins applied by the restarted agent")
    # and the restarted agent applies it at the next start too
    _destroy(env, name)
    g = _create(env, name, uid)
    h.wait_for(g.vcpu_pins, want, what="pins after a restart and createXML")

    # delete removes it for good
    agent.cli("policy", "delete", name)
    _destroy(env, name)
    assert all(p["uuid"] != uid for p in agent.request("list_policies")["policies"])
    g = _create(env, name, uid)
    agent.request("reconcile")
    assert g.vcpu_pins() != want
    _destroy(env, name)
