"""Policy stays intact when the agent is killed (-9) and restarted, and when
libvirtd is killed and restarted under a running agent (only a libvirtd the
test session started itself: see the own_libvirtd fixture)."""

from __future__ import annotations

import shutil
import signal

import pytest

from tests.e2e.libvirt import helpers as h
from tests.support import libvirtd

pytestmark = pytest.mark.libvirt


def _setup_pair(env, guests, agent):
    """A dedicated guest on the pool CPU and a pinned/weighted guest on the shared set, both running."""
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    pool, shared = frozenset({hi}), env.host_cpus - {hi}
    ded = guests.define(vcpus=1)
    pinned = guests.define(vcpus=2)
    agent.cli("policy", "set", ded, "--dedicated", "1", "--weight", "800")
    agent.cli("policy", "set", pinned, "--pin", f"0={lo}", "--pin", f"1={lo}", "--weight", "400", "--cap", "40")
    d, p = guests.start(ded), guests.start(pinned)
    want_d, want_p = {0: pool}, {0: frozenset({lo}), 1: frozenset({lo})}
    h.wait_for(d.vcpu_pins, want_d, what=f"{ded} pins")
    h.wait_for(p.vcpu_pins, want_p, what=f"{pinned} pins")
    h.wait_for(lambda: set(d.emulator_pins().values()), {shared}, what=f"{ded} emulator threads")
    return ded, pinned, d, p, want_d, want_p, pool, shared


def _assert_intact(d, p, want_d, want_p, pool, shared):
    assert d.vcpu_pins() == want_d, h.fmt_pins(d.vcpu_pins())
    assert p.vcpu_pins() == want_p, h.fmt_pins(p.vcpu_pins())
    assert d.shares() == 800 and p.shares() == 400
    assert p.vcpu_quotas() == {0: (40000, 100000), 1: (40000, 100000)}
    assert h.threads_on(pool, exclude_tids=set(d.vcpus().values())) == []


def test_agent_kill9_and_restart(env, guests, agent_factory):
    hi = max(env.host_cpus)
    agent = agent_factory(dedicated_pool=str(hi))
    ded, pinned, d, p, want_d, want_p, pool, shared = _setup_pair(env, guests, agent)
    pids = (d.pid(), p.pid())

    agent.kill9()
    assert not agent.running()
    # libvirt keeps what the agent gave it
    _assert_intact(d, p, want_d, want_p, pool, shared)
    # even a destroy + start while the agent is dead keeps the policy (it is in the definition)
    guests.destroy(ded)
    d = guests.start(ded)
    assert d.vcpu_pins() == want_d

    # restart with the same state dir and pool
    agent.start()
    assert p.pid() == pids[1], "the untouched guest kept its QEMU process"
    cpus = agent.request("cpus")
    assert cpus["allocations"] == {ded: str(hi)}, f"allocation lost or moved over the restart: {cpus}"
    for name in (ded, pinned):
        view = agent.request("get_policy", {"guest": name})
        assert view["status"] == "applied", view
    _assert_intact(d, p, want_d, want_p, pool, shared)

    # the restarted agent enforces again
    h.virsh("vcpupin", pinned, "1", ",".join(map(str, sorted(env.host_cpus))), "--live", check=True)
    h.wait_for(p.vcpu_pins, want_p, what=f"{pinned} drift repaired by the restarted agent")

    # kill -9 again and come back with an EMPTY state dir: the host state is
    # rebuilt from the guests (allocation hint in the domain metadata)
    agent.kill9()
    shutil.rmtree(agent.state_dir)
    agent.start()
    cpus = agent.request("cpus")
    assert cpus["allocations"] == {ded: str(hi)}, f"allocation not rebuilt from the guests: {cpus}"
    _assert_intact(d, p, want_d, want_p, pool, shared)
    h.virsh("vcpupin", ded, "0", ",".join(map(str, sorted(env.host_cpus))), "--live", check=True)
    h.wait_for(d.vcpu_pins, want_d, what=f"{ded} drift repaired after a restart from scratch")


def test_libvirtd_killed_and_restarted_under_a_running_agent(own_libvirtd, guests, agent_factory):
    env = own_libvirtd  # skips when libvirtd was running before the tests: it is not ours to kill
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    agent = agent_factory(dedicated_pool=str(hi))
    ded, pinned, d, p, want_d, want_p, pool, shared = _setup_pair(env, guests, agent)
    pids = (d.pid(), p.pid())
    reconnects = agent.metric("vmsched_agent_libvirt_reconnects_total")

    # SIGKILL libvirtd, then start it the way setup does
    old, new = libvirtd.restart_libvirtd(signal.SIGKILL)
    assert old != new
    # the guests survived with their pins (libvirtd reattached to the same QEMU processes)
    assert (d.pid(), p.pid()) == pids
    _assert_intact(d, p, want_d, want_p, pool, shared)

    # the agent noticed, reconnected, and enforces again
    h.wait_until(lambda: agent.metric("vmsched_agent_libvirt_reconnects_total") > reconnects,
                 what="the agent to reconnect to the restarted libvirtd")
    h.wait_for(lambda: agent.request("ping")["connected"], True, what="agent connected")
    assert agent.running()
    h.virsh("vcpupin", pinned, "0", str(hi), "--live", check=True)
    h.wait_for(p.vcpu_pins, want_p, what=f"{pinned} drift repaired after the libvirtd restart")
    h.wait_until(lambda: h.threads_on(pool, exclude_tids=set(d.vcpus().values())) == [],
                 what="the pool CPU free of other threads again")

    # a guest defined and started after the restart gets its policy
    late = guests.define(vcpus=2)
    agent.cli("policy", "set", late, "--pin", f"0={lo}", "--weight", "900")
    lt = guests.start(late)
    assert lt.vcpu_pins()[0] == frozenset({lo})
    h.wait_for(lt.all_thread_cpus, shared, what=f"{late} confined to the shared set")
    assert lt.shares() == 900

    # and a plain SIGTERM restart (what the hook install does) is fine as well
    libvirtd.restart_libvirtd(signal.SIGTERM)
    env.ensure_libvirtd()
    _assert_intact(d, p, want_d, want_p, pool, shared)
    h.wait_for(lambda: agent.request("ping")["connected"], True, what="agent connected after SIGTERM restart")
