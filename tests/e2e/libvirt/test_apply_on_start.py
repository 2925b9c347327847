"""A policy set through the agent is in force, at the OS level, from the moment
the guest's QEMU process runs, and is applied live to a running guest."""

from __future__ import annotations

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt


def cpuset(*cpus: int) -> frozenset[int]:
    return frozenset(cpus)


def test_policy_in_place_as_soon_as_the_guest_runs(env, guests, agent):
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    name = guests.define(vcpus=2)
    view = agent.cli_json("policy", "set", name, "--pin", f"0={hi}", "--pin", f"1={lo}",
                          "--emulator-pin", str(lo), "--weight", "512", "--cap", "50", "--json")
    assert view["status"] == "applied", view

    # Started behind the agent's back (plain libvirt API, as virsh or oVirt would).
    g = guests.start(name)

    # One observation right after start: the policy was written into the
    # persistent definition, so there is no window in which the guest runs unpinned.
    assert g.vcpu_pins() == {0: cpuset(hi), 1: cpuset(lo)}, h.fmt_pins(g.vcpu_pins())
    emu = g.emulator_pins()
    assert emu and set(emu.values()) == {cpuset(lo)}, f"emulator threads: {emu}"
    assert g.shares() == 512
    assert g.vcpu_quotas() == {0: (50000, 100000), 1: (50000, 100000)}

    # and the agent agrees that what it wants is in place
    view = h.wait_for(lambda: agent.request("get_policy", {"guest": name}),
                      lambda v: v["status"] == "applied" and v["state"] == "running", what="agent's view")
    assert view["desired"]["vcpus"] == {"0": str(hi), "1": str(lo)}


def test_policy_set_on_a_running_guest_applies_live_and_delete_unpins(env, guests, agent):
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    every = env.host_cpus
    name = guests.define(vcpus=2)
    g = guests.start(name)
    assert g.vcpu_pins() == {0: every, 1: every}
    assert g.shares() == 1024

    agent.cli("policy", "set", name, "--pin", f"0={hi}", "--pin", f"1={lo}", "--weight", "300",
              "--quota", "20000", "--period", "50000")
    h.wait_for(g.vcpu_pins, {0: cpuset(hi), 1: cpuset(lo)}, what=f"{name} vCPU threads' Cpus_allowed_list")
    h.wait_for(g.shares, 300, what=f"{name} cpu.shares")
    h.wait_for(g.vcpu_quotas, {0: (20000, 50000), 1: (20000, 50000)}, what=f"{name} vCPU cfs quota/period")
    pid = g.pid()

    # the same policy must also be in the definition: a new QEMU process has it at once
    guests.destroy(name)
    g = guests.start(name)
    assert g.pid() != pid
    assert g.vcpu_pins() == {0: cpuset(hi), 1: cpuset(lo)}
    assert g.shares() == 300
    assert g.vcpu_quotas() == {0: (20000, 50000), 1: (20000, 50000)}

    # deleting the policy gives the guest back libvirt's defaults, live
    agent.cli("policy", "delete", name)
    h.wait_for(g.vcpu_pins, {0: every, 1: every}, what=f"{name} unpinned after delete")
    h.wait_for(g.shares, 1024, what=f"{name} cpu.shares after delete")
    h.wait_for(lambda: {q for q, _ in g.vcpu_quotas().values()}, {-1}, what=f"{name} cfs quota after delete")


def test_invalid_policy_is_refused_and_changes_nothing(env, guests, agent):
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    name = guests.define(vcpus=2)
    agent.cli("policy", "set", name, "--pin", f"0={hi}", "--pin", f"1={lo}")
    g = guests.start(name)
    before = g.vcpu_pins()
    # a CPU the host does not have, and a vCPU the guest does not have
    proc = agent.cli("policy", "set", name, "--pin", f"0={hi + 64}", "--pin", "7=0", check=False)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert str(hi + 64) in proc.stderr and "7" in proc.stderr, proc.stderr
    assert g.vcpu_pins() == before
    assert agent.request("get_policy", {"guest": name})["policy"]["vcpu_pins"] == {"0": str(hi), "1": str(lo)}
