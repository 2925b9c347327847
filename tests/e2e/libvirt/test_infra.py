"""The probes themselves: without the agent, libvirt's own pinning and
scheduler changes must show up where the other tests look for the agent's.

If this test fails, the OS-level assertions of the other tests prove nothing.
"""

from __future__ import annotations

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt


def test_probes_see_virsh_pinning_and_cgroup_values(env, guests):
    name = guests.define(vcpus=2)
    g = guests.start(name)
    cpus = env.host_cpus
    assert len(cpus) >= 2, f"the e2e tests need at least 2 host CPUs, this host has {sorted(cpus)}"
    first, last = min(cpus), max(cpus)

    # a fresh guest: every vCPU thread may run anywhere
    assert set(g.vcpus()) == {0, 1}, f"vCPU threads by comm: {h.threads(g.pid())}"
    assert g.vcpu_pins() == {0: cpus, 1: cpus}
    cg = g.cgroup(0)
    assert cg.vcpu_dir.name == "vcpu0" and name in cg.guest_dir.name, cg.guest_dir
    assert g.vcpu_quotas()[0][0] == -1

    # virsh vcpupin changes exactly the thread it names
    h.virsh("vcpupin", name, "0", str(last), "--live", check=True)
    h.virsh("vcpupin", name, "1", str(first), "--live", check=True)
    assert g.vcpu_pins() == {0: frozenset({last}), 1: frozenset({first})}

    # virsh schedinfo lands in the guest's cpu cgroup
    h.virsh("schedinfo", name, "--live", "cpu_shares=345", "vcpu_quota=23000", "vcpu_period=100000", check=True)
    assert g.shares() == 345
    assert g.vcpu_quotas() == {0: (23000, 100000), 1: (23000, 100000)}

    # emulator pinning moves the non-vCPU threads
    h.virsh("emulatorpin", name, str(first), "--live", check=True)
    assert set(g.emulator_pins().values()) == {frozenset({first})}

    # a new QEMU process after destroy + start, with libvirt's defaults again
    old_pid = g.pid()
    guests.destroy(name)
    g = guests.start(name)
    assert g.pid() != old_pid
    assert g.vcpu_pins() == {0: cpus, 1: cpus}
