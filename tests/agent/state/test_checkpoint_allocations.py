"""The checkpoint on disk always holds the allocations the agent acts on (libvirt's test driver)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import libvirt

from tests.support.agent_driver import conn, domain_xml, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.waiting import wait_until
from vmsched.services.policy_agent.agent import Agent
from vmsched import cpuset
from vmsched.services.policy_agent.state import checkpoint
from vmsched.services.policy_agent.errors import AgentError
from vmsched.services.policy_agent.virt import metadata


def on_disk(a: Agent) -> dict[str, str]:
    """guest name -> CPUs, as the checkpoint file says ({} when it is missing or unusable)."""
    loaded, _ = checkpoint.load(a.checkpoint_path, a.machine, a.pools.host_cpus)
    return {} if loaded is None else {loaded.pools.name(u): cpuset.fmt(c) for u, c in loaded.pools.allocations.items()}


def with_hint(name: str, host: str, cpus: str) -> str:
    """A guest whose metadata records dedicated CPUs this host gave it (what a lost checkpoint leaves)."""
    policy = f"<vmsched:policy xmlns:vmsched='{metadata.NS}'><vmsched:dedicated count='1'/>" \
             f"<vmsched:allocation host='{host}' cpus='{cpus}' pool='4-7'/></vmsched:policy>"
    return domain_xml(name, vcpus=1).replace("</domain>", f"<metadata>{policy}</metadata></domain>")


def test_allocation_seeded_from_the_metadata_hint_is_saved(conn: libvirt.virConnect, make_agent, state_dir: Path):
    a = make_agent()
    a.checkpoint_path.unlink()  # the checkpoint is lost
    conn.defineXML(with_hint("t-seed", a.machine, "7")).create()  # its CPUs come back from its metadata
    wait_until(lambda: a.cpus()["allocations"] == {"t-seed": "7"})  # its events handled
    assert on_disk(a) == {"t-seed": "7"}


def test_the_sweep_repairs_a_checkpoint_that_differs(conn: libvirt.virConnect, make_agent):
    a = make_agent()
    conn.defineXML(domain_xml("t-ded")).create()
    a.set_policy("t-ded", {"dedicated": 2})
    a.checkpoint_path.unlink()
    a.reconcile()
    assert on_disk(a) == {"t-ded": "4-5"}
    held = checkpoint.Checkpoint.of(a.machine, a.host_id, a.pools)
    held.allocations = {}
    checkpoint.save(a.checkpoint_path, held)  # says nothing is held
    a.reconcile()
    assert on_disk(a) == a.cpus()["allocations"] == {"t-ded": "4-5"}


def test_rapid_set_and_delete_from_8_threads_keep_the_checkpoint_equal(conn: libvirt.virConnect, make_agent):
    a = make_agent()
    names = ["t-ga", "t-gb", "t-gc"]
    for name in names:
        conn.defineXML(domain_xml(name, vcpus=1)).create()
    errors: list[str] = []

    def churn(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(25):
            name = rnd.choice(names)
            try:
                if rnd.random() < 0.5:
                    a.set_policy(name, {"dedicated": rnd.choice([1, 2])})
                else:
                    a.delete_policy(name)
            except AgentError as exc:  # the pool may be full: refused, never inconsistent
                if "only" not in str(exc):
                    errors.append(str(exc))

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert a.wait_idle(30)
    assert on_disk(a) == a.cpus()["allocations"], "right after the calls and their events"
    a.reconcile()
    assert on_disk(a) == a.cpus()["allocations"]
