"""The policy survives a guest reset (same QEMU process, two REBOOT events)
and a destroy + start (new QEMU process, new cgroups)."""

from __future__ import annotations

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt

REBOOT_HANDLED = 'vmsched_agent_event_to_applied_seconds_count{event="reboot"}'
STARTED_HANDLED = 'vmsched_agent_event_to_applied_seconds_count{event="started"}'


def test_policy_kept_across_reset_and_destroy_start(env, guests, agent):
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    want = {0: frozenset({hi}), 1: frozenset({lo})}
    name = guests.define(vcpus=2)
    agent.cli("policy", "set", name, "--pin", f"0={hi}", "--pin", f"1={lo}", "--emulator-pin", str(lo),
              "--weight", "700", "--cap", "30")
    g = guests.start(name)
    h.wait_for(g.vcpu_pins, want, what="pins after start")
    assert g.shares() == 700

    # --- reset: QEMU keeps its process; libvirt sends two REBOOT events ---
    pid = g.pid()
    cgroup_dir = g.cgroup().guest_dir
    handled = agent.metric(REBOOT_HANDLED)
    guests.dom(name).reset(0)
    # wait until the agent has handled the reboot (debounced), then look at the OS
    h.wait_until(lambda: agent.metric(REBOOT_HANDLED) > handled, what="the agent to handle the REBOOT event")
    assert g.pid() == pid, "reset must not replace the QEMU process"
    assert g.cgroup().guest_dir == cgroup_dir
    assert g.vcpu_pins() == want, h.fmt_pins(g.vcpu_pins())
    assert set(g.emulator_pins().values()) == {frozenset({lo})}
    assert g.shares() == 700
    assert g.vcpu_quotas() == {0: (30000, 100000), 1: (30000, 100000)}

    # --- destroy + start: a new QEMU process in a new cgroup ---
    guests.destroy(name)
    started = agent.metric(STARTED_HANDLED)
    g = guests.start(name)
    assert g.pid() != pid
    assert g.cgroup().guest_dir != cgroup_dir, "a restarted guest gets a new machine/qemu-N-... cgroup"
    # in place at once (from the definition) ...
    assert g.vcpu_pins() == want, h.fmt_pins(g.vcpu_pins())
    assert g.shares() == 700
    # ... and still in place once the agent has verified the new process
    h.wait_until(lambda: agent.metric(STARTED_HANDLED) > started, what="the agent to handle the STARTED event")
    assert g.vcpu_pins() == want
    assert set(g.emulator_pins().values()) == {frozenset({lo})}
    assert g.shares() == 700
    assert g.vcpu_quotas() == {0: (30000, 100000), 1: (30000, 100000)}

    # --- a second reset on the new process, for good measure ---
    handled = agent.metric(REBOOT_HANDLED)
    guests.dom(name).reset(0)
    h.wait_until(lambda: agent.metric(REBOOT_HANDLED) > handled, what="the agent to handle the second REBOOT")
    assert g.vcpu_pins() == want
    assert g.shares() == 700
