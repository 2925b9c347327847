"""Changes made behind the agent's back (virsh vcpupin / emulatorpin /
schedinfo on a running guest) are undone.

The agent runs with a one-hour reconcile interval here, so what restores the
policy within the test's deadline is its reaction to libvirt's TUNABLE event,
not the periodic sweep.
"""

from __future__ import annotations

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt

DRIFT = "vmsched_agent_drift_corrections_total"


def test_manual_vcpupin_is_reverted(env, guests, agent_factory):
    agent = agent_factory(reconcile_interval=3600)
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    want = {0: frozenset({hi}), 1: frozenset({lo})}
    name = guests.define(vcpus=2)
    agent.cli("policy", "set", name, "--pin", f"0={hi}", "--pin", f"1={lo}", "--emulator-pin", str(lo),
              "--weight", "600")
    g = guests.start(name)
    h.wait_for(g.vcpu_pins, want, what="pins after start")

    # 1. a manual vcpupin moves vCPU 0 onto the other CPU
    drift0 = agent.metric(DRIFT)
    out = h.virsh("vcpupin", name, "0", str(lo), "--live", check=True)
    assert out.returncode == 0
    h.wait_for(g.vcpu_pins, want, what="vCPU 0 pinned back after `virsh vcpupin 0 lo`")
    h.wait_until(lambda: agent.metric(DRIFT) > drift0, what="the agent to count the drift it restored")

    # 2. unpinning both vCPUs
    drift1 = agent.metric(DRIFT)
    cpus = ",".join(map(str, sorted(env.host_cpus)))
    h.virsh("vcpupin", name, "0", cpus, "--live", check=True)
    h.virsh("vcpupin", name, "1", cpus, "--live", check=True)
    h.wait_for(g.vcpu_pins, want, what="both vCPUs pinned back after unpinning them")
    h.wait_until(lambda: agent.metric(DRIFT) > drift1, what="a drift correction for the unpinning")

    # 3. emulator threads and cpu_shares
    h.virsh("emulatorpin", name, cpus, "--live", check=True)
    h.virsh("schedinfo", name, "--live", "cpu_shares=5000", check=True)
    h.wait_for(lambda: set(g.emulator_pins().values()), {frozenset({lo})}, what="emulator threads pinned back")
    h.wait_for(g.shares, 600, what="cpu.shares restored")
    assert g.vcpu_pins() == want

    # 4. the persistent definition too: a changed config pin does not survive into the next start.
    # libvirt sends no event for a --config-only change (qemuDomainPinVcpuFlags saves the definition
    # silently), so with a one-hour sweep the agent first sees it when the guest starts again.
    h.virsh("vcpupin", name, "1", str(hi), "--config", check=True)
    import libvirt

    inactive = libvirt.VIR_DOMAIN_XML_INACTIVE
    guests.destroy(name)
    g = guests.start(name)
    h.wait_for(g.vcpu_pins, want, what="pins after the restart with a changed config pin")
    h.wait_until(lambda: f"vcpu='1' cpuset='{lo}'" in guests.dom(name).XMLDesc(inactive),
                 what="the config pin of vCPU 1 restored in the definition at the start")
