"""A guest with a dedicated pCPU runs alone on it: its vCPU thread is pinned
to the pool CPU, and every other QEMU thread on the host (other guests'
vCPUs and emulator threads, its own emulator threads) is confined to the
shared CPUs. On this 2-CPU machine: pool = {1}, shared = {0}.
"""

from __future__ import annotations

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = pytest.mark.libvirt


def test_dedicated_guest_alone_on_its_pcpu(env, guests, agent_factory):
    hi = max(env.host_cpus)
    pool = frozenset({hi})
    shared = env.host_cpus - pool
    agent = agent_factory(dedicated_pool=str(hi))
    cpus = agent.request("cpus")
    assert h.parse_cpus(cpus["dedicated_pool"]) == pool and h.parse_cpus(cpus["shared"]) == shared, cpus

    # a guest without any policy, running before the dedicated guest exists
    early = guests.define(vcpus=2)
    e = guests.start(early)
    h.wait_for(e.all_thread_cpus, shared, what=f"every thread of {early} confined to the shared CPUs")

    # the dedicated guest
    ded = guests.define(vcpus=1)
    view = agent.cli_json("policy", "set", ded, "--dedicated", "1", "--json")
    assert h.parse_cpus(view["allocation"]) == pool, view
    d = guests.start(ded)
    assert d.vcpu_pins() == {0: pool}, "the dedicated vCPU is pinned from the first instant"
    h.wait_for(lambda: set(d.emulator_pins().values()), {shared},
               what=f"{ded}'s emulator threads on the shared CPUs")

    # a guest started after it, again without a policy
    late = guests.define(vcpus=2)
    lt = guests.start(late)
    h.wait_for(lt.all_thread_cpus, shared, what=f"every thread of {late} confined to the shared CPUs")

    # alone: no QEMU thread on the host but the dedicated vCPU may run on the pool CPU
    ded_vcpu = set(d.vcpus().values())
    h.wait_for(lambda: h.threads_on(pool, exclude_tids=ded_vcpu), [],
               what=f"QEMU threads other than {ded}'s vCPU allowed on pCPU {hi}")
    assert e.all_thread_cpus() == shared and lt.all_thread_cpus() == shared

    # the agent's own account agrees
    cpus = agent.request("cpus")
    assert cpus["allocations"] == {ded: str(hi)}, cpus
    assert cpus["free"] == "", cpus

    # a second dedicated request cannot be met: refused, nothing moves
    other = guests.define(vcpus=1)
    proc = agent.cli("policy", "set", other, "--dedicated", "1", check=False)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert h.threads_on(pool, exclude_tids=ded_vcpu) == []

    # an interloper pinned onto the pool CPU by hand is pushed back to the shared set
    h.virsh("vcpupin", early, "0", str(hi), "--live", check=True)
    h.wait_for(e.all_thread_cpus, shared, what=f"{early} pushed back off pCPU {hi}")
    assert d.vcpu_pins() == {0: pool}

    # deleting the dedicated policy releases the CPU; the guest, now without a
    # policy, joins the others on the shared set (the pool stays reserved)
    agent.cli("policy", "delete", ded)
    h.wait_for(lambda: h.parse_cpus(agent.request("cpus")["free"]), pool, what="pool CPU released")
    h.wait_for(d.all_thread_cpus, shared, what=f"{ded} confined to the shared set after delete")
    h.wait_for(lambda: h.threads_on(pool), [], what=f"QEMU threads allowed on the (free) pool pCPU {hi}")
