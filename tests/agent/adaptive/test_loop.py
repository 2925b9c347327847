"""The tuner wired into the agent, on libvirt's test driver: a tuned change is applied live, kept by sweeps
(no repair counted), recorded (metric, event, explain), dropped at a guest restart; dry-run changes nothing.

The test driver reports no vCPU statistics and the host's /proc/stat is not ours to steer, so the
counters are crafted: the loop's two inputs (``_read_counters`` and the ``stat`` file under its proc
folder) are replaced, everything after them (engine, guard, apply, enforcer) is the agent's own code.
Real counters on real QEMU: tests/e2e/libvirt/test_adaptive.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import libvirt

from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.agent_driver import domain_xml, live_pins, metric
from vmsched.metrics import REGISTRY
from vmsched.services.policy_agent.agent import Agent
from vmsched.services.policy_agent.tuners.config import TunerConfig
from vmsched.services.policy_agent.tuners.samples import VcpuCounters


def repairs() -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "vmsched_agent_repairs" for s in m.samples
               if s.name == "vmsched_agent_repairs_total")


class Feed:
    """Crafted counters: pCPU 1 saturated, the others at 10 %; guests waiting half the time."""

    def __init__(self, agent: Agent, proc: Path):
        self.agent, self.proc, self.ncpus, self.ticks, self.ns = agent, proc, len(agent.pools.host_cpus), 0, 0
        loop = agent._tuner
        assert loop is not None
        loop._proc = proc
        loop._read_counters = self.counters  # type: ignore[method-assign]
        self.write_stat()

    def write_stat(self) -> None:
        lines = ["cpu 0 0 0 0 0 0 0 0"]
        for c in range(self.ncpus):
            busy = self.ticks if c == 1 else self.ticks // 10
            lines.append(f"cpu{c} {busy} 0 0 {self.ticks - busy} 0 0 0 0")
        (self.proc / "stat").write_text("\n".join(lines) + "\n")

    def counters(self, guests):
        return {g.uuid: VcpuCounters(2, self.ns, self.ns // 2, int(self.agent.conn.lookupByUUIDString(g.uuid).ID()))
                for g in guests}

    def round(self):
        self.ticks += 1000
        self.ns += 2_000_000_000
        self.write_stat()
        loop = self.agent._tuner
        loop._when = (loop._when or 0) - 1.0  # one crafted second per round  # type: ignore[union-attr]
        return loop.run_once()  # type: ignore[union-attr]


def start_agent(make_agent: Callable[..., Agent], **tuner) -> Agent:  # noqa: F811
    """interval 0: no tuner thread, the rounds are driven by the test."""
    return make_agent(tuner=TunerConfig(interval=0, hysteresis=2, **tuner))


def two_guests(conn, agent: Agent) -> list[libvirt.virDomain]:
    doms = []
    for name in ("t-a1", "t-a2"):
        dom = conn.defineXML(domain_xml(name, 2))
        dom.create()
        agent.set_policy(name, {"vcpu_pins": {0: "1", 1: "1"}, "adaptive": {"may_move": True}})
        doms.append(dom)
    return doms


def test_a_tuned_move_is_applied_live_kept_by_sweeps_and_explained(conn, make_agent, tmp_path):
    agent = start_agent(make_agent)
    doms = two_guests(conn, agent)
    feed = Feed(agent, tmp_path)
    before = repairs()
    decisions = [d for _ in range(3) for d in feed.round()]  # a baseline, then K=2 samples
    applied = [d for d in decisions if d.outcome == "applied"]
    assert len(applied) == 1 and applied[0].tuner == "hotspot", decisions
    mover = next(d for d in doms if d.UUIDString() == applied[0].uuid)
    assert live_pins(mover) == {0: "0", 1: "0"}  # the least busy shared CPU
    other = next(d for d in doms if d is not mover)
    assert live_pins(other) == {0: "1", 1: "1"}
    assert agent.reconcile()["repaired"] == 0  # the sweep keeps the tuned pins as desired state
    assert live_pins(mover) == {0: "0", 1: "0"} and repairs() == before
    assert metric("vmsched_agent_tuner_changes_total", tuner="hotspot", field="vcpus", outcome="applied") >= 1
    events = [b for e, b in agent.events if e == "tuned"]
    assert events and events[-1]["after"] == {"0": "0", "1": "0"} and events[-1]["before"] == {"0": "1", "1": "1"}
    explained = agent.explain_policy(mover.name())
    assert explained["tuned"] == {"vcpus": {"0": "0", "1": "0"}}
    assert explained["decisions"][-1]["reason"].startswith("CPU 1 saturated for 2 intervals")
    assert explained["policy"]["vcpu_pins"] == {"0": "1", "1": "1"}

    mover.destroy()  # a restart: the tuned values end with the run, the static policy is back
    mover.create()
    agent.reconcile()
    assert live_pins(mover) == {0: "1", 1: "1"}
    assert agent.explain_policy(mover.name())["tuned"] == {}


def test_dry_run_reports_and_changes_nothing(conn, make_agent, tmp_path):
    agent = start_agent(make_agent, dry_run=True)
    doms = two_guests(conn, agent)
    feed = Feed(agent, tmp_path)
    decisions = [d for _ in range(3) for d in feed.round()]  # a baseline, then K=2 samples
    assert [d.outcome for d in decisions] == ["dry_run"]
    assert all(live_pins(d) == {0: "1", 1: "1"} for d in doms)
    assert [b["outcome"] for e, b in agent.events if e == "tuned"] == ["dry_run"]
    assert agent.explain_policy("t-a1")["tuned"] == {}


def test_a_change_libvirt_refuses_is_an_error_and_the_static_policy_stays(conn, make_agent, tmp_path, monkeypatch):
    agent = start_agent(make_agent)
    doms = two_guests(conn, agent)
    feed = Feed(agent, tmp_path)
    from vmsched.services.policy_agent.virt.apply import Applier

    real = Applier.verify_and_repair

    def refuse(self, dom, desired, active, persistent, *a, **k):
        if desired.vcpus and desired.vcpus.get(0) == frozenset({0}):
            raise libvirt.libvirtError("refused by the test")
        return real(self, dom, desired, active, persistent, *a, **k)

    monkeypatch.setattr(Applier, "verify_and_repair", refuse)
    decisions = [d for _ in range(3) for d in feed.round()]
    assert [d.outcome for d in decisions] == ["error"]
    assert "back to the static policy" in decisions[0].reason
    assert all(live_pins(d) == {0: "1", 1: "1"} for d in doms)
    explained = agent.explain_policy(decisions[0].guest)
    assert explained["tuned"] == {} and explained["decisions"][-1]["outcome"] == "error"
    assert metric("vmsched_agent_tuner_changes_total", tuner="hotspot", field="vcpus", outcome="error") >= 1
