"""Dedicated CPUs in the host facts and the stock vmsched_DedicatedCpus filter.

The agent's reporter on libvirt's test driver fills the dedicated-pool fields;
a reader derives them from an older agent's message; the filter runs in a real
plugin worker, in the sandbox, on crafted facts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vmsched.config import stock_plugins_dir
from vmsched.facts.model import FACTS_VERSION, HostFacts, read
from vmsched.runtime import Call, PluginPool
from vmsched.runtime.types import Confinement

A, B, C, D = (f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(1, 5))
VM = "11111111-2222-3333-4444-555555555555"
UNIT = ("vmsched_dedicated_cpus", "vmsched_DedicatedCpus")


@pytest.fixture(scope="module")
def pool() -> Iterator[PluginPool]:
    pool = PluginPool(stock_plugins_dir(), size=1, name=f"dedicated-{uuid.uuid4().hex[:8]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    yield pool
    pool.close()


def run(pool: PluginPool, hosts: list[str], facts: dict[str, Any]) -> Any:
    (result,) = pool.run([Call(*UNIT, "do_filter", (hosts, VM, {}), 10.0, facts)])
    return result


def host(free: int | None, pool_cpus: int = 8, **extra: Any) -> dict[str, Any]:
    return {"dedicated_pool_cpus": pool_cpus, "dedicated_free_cpus": free, "threads": 2, **extra}


def payload(hosts: dict[str, dict], vm: dict | None = None, problem: str | None = None) -> dict[str, Any]:
    return {"hosts": hosts, "missing": {}, "vm": vm, "vm_problem": problem}


# --- the facts ---------------------------------------------------------------------------

def test_reporter_reports_pool_size_free_cpus_and_what_known_guests_want(tmp_path: Path) -> None:
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")
    from vmsched.services.policy_agent.policy.model import GuestPolicy
    from vmsched.services.policy_agent.facts.reporter import FactsReporter
    from vmsched.services.policy_agent.virt.collector import Collector
    from tests.services.test_facts_units import fake_proc

    conn = libvirt.open("test:///default")
    running = conn.lookupByName("test").UUIDString()
    stored = "99999999-0000-0000-0000-000000000001"  # a transient guest's stored policy: not on this host now
    policies = {running: GuestPolicy(dedicated=2, vcpu_pins={0: "4", 1: "5"}), stored: GuestPolicy(dedicated="6-8")}
    layout = (frozenset({4, 5, 6, 7, 8}), frozenset({0, 1, 2, 3}), {running: frozenset({4, 5})}, policies)
    reporter = FactsReporter("hv1", Collector(proc=fake_proc(tmp_path), sys_dir=tmp_path / "sys"), lambda: conn,
                             lambda: layout, lambda *_: None)
    try:
        message = read(json.dumps(reporter.collect().model_dump(mode="json")))  # as a reader gets it
    finally:
        reporter.collector.close()
    h = message.host
    assert message.v == FACTS_VERSION
    assert (h.dedicated_pool_cpus, h.dedicated_free_cpus) == (5, 3)
    assert {u: (g.wanted, g.held) for u, g in h.dedicated_guests.items()} == {running: (2, 2), stored: (3, 0)}
    # per NUMA node of the test driver (0-7, 8-15): the pool's free CPUs and free whole cores (no SMT: one each)
    assert [(n.node, n.free_cpus, n.free_cores, n.free_core_cpus) for n in h.dedicated_nodes] == [(0, 2, 2, 2),
                                                                                                (1, 1, 1, 1)]
    (guest,) = message.guests or []
    assert guest.dedicated and guest.dedicated_cpus == 2 and guest.pinned and guest.has_policy


# --- the filter --------------------------------------------------------------------------

def test_a_vm_with_a_known_policy_goes_only_where_the_pool_has_its_cpus_free(pool: PluginPool) -> None:
    wants = {VM: {"wanted": 4, "held": 0}}
    facts = payload({A: host(4, dedicated_guests=wants), B: host(3), C: host(0, stale=True),
                     D: host(1, dedicated_guests={VM: {"wanted": 4, "held": 3}})})  # its own 3 count as free
    result = run(pool, [A, B, C, D], facts)
    assert result.ok and result.value == [A, C, D]


def test_the_engines_dedicated_pinning_policy_sets_the_need(pool: PluginPool) -> None:
    hosts = {A: host(4), B: host(3), C: host(8)}
    dedicated = {"id": VM, "vcpus": 4, "memory_mib": 1024, "source": "engine", "cpu_pinning_policy": "dedicated"}
    assert run(pool, [A, B, C], payload(hosts, dedicated)).value == [A, C]
    isolated = {**dedicated, "cpu_pinning_policy": "isolate_threads"}  # 4 vCPUs x 2 threads per core
    assert run(pool, [A, B, C], payload(hosts, isolated)).value == [C]
    unpinned = {**dedicated, "cpu_pinning_policy": "none"}
    assert run(pool, [A, B, C], payload(hosts, unpinned)).value == [A, B, C]


def test_a_running_vm_without_a_dedicated_policy_needs_none(pool: PluginPool) -> None:
    facts = payload({A: host(0), B: host(0)}, {"id": VM, "vcpus": 2, "memory_mib": 512, "host_id": A,
                                             "source": "host facts"})
    assert run(pool, [A, B], facts).value == [A, B]


def test_a_vm_of_unknown_need_is_an_error_that_drops_no_host(pool: PluginPool) -> None:
    facts = payload({A: host(0), B: host(8)}, None, "no engine link is configured")
    result = run(pool, [A, B], facts)
    assert not result.ok and "dedicated CPUs of VM" in result.error and "no engine link is configured" in result.error


# --- per NUMA node, with thread and NUMA policies ----------------------------------------------

def nodes(*rooms: tuple[int, int, int]) -> list[dict[str, int]]:
    """(free CPUs, free whole cores, CPUs on them) per node."""
    return [{"node": i, "free_cpus": c, "free_cores": k, "free_core_cpus": kc} for i, (c, k, kc) in enumerate(rooms)]


def test_thread_and_numa_policies_need_room_in_the_right_unit(pool: PluginPool) -> None:
    strict = {VM: {"wanted": 4, "held": 0, "thread_policy": "isolate", "numa": "strict"}}
    facts = payload({A: host(10, dedicated_nodes=nodes((5, 2, 4), (5, 3, 6)), dedicated_guests=strict),
                     B: host(8, dedicated_nodes=nodes((8, 4, 8), (0, 0, 0))),
                     C: host(12, dedicated_nodes=nodes((6, 3, 6), (6, 3, 6)))})
    assert run(pool, [A, B, C], facts).value == [B]  # 4 whole cores in one node: only B has them
    spread = {VM: {**strict[VM], "numa": "any"}}
    facts["hosts"][A]["dedicated_guests"] = spread
    assert run(pool, [A, B, C], facts).value == [A, B, C]  # 2 + 3 and 3 + 3 cores across nodes
    required = {VM: {"wanted": 6, "held": 0, "thread_policy": "require", "numa": "strict"}}
    facts["hosts"][A]["dedicated_guests"] = required
    assert run(pool, [A, B, C], facts).value == [A, B, C]  # 6 CPUs on whole cores in one node: 6, 8 and 6


def test_the_engines_pinning_policies_map_onto_thread_and_numa_policies(pool: PluginPool) -> None:
    hosts = {A: host(8, dedicated_nodes=nodes((4, 1, 2), (4, 1, 2))),  # 8 free CPUs but 2 whole cores
             B: host(8, dedicated_nodes=nodes((8, 4, 8)))}
    vm = {"id": VM, "vcpus": 4, "memory_mib": 1024, "source": "engine"}
    assert run(pool, [A, B], payload(hosts, {**vm, "cpu_pinning_policy": "dedicated"})).value == [A, B]
    assert run(pool, [A, B], payload(hosts, {**vm, "cpu_pinning_policy": "isolate_threads"})).value == [B]
    assert run(pool, [A, B], payload(hosts, {**vm, "cpu_pinning_policy": "resize_and_pin_numa"})).value == [A, B]
    from vmsched.engine_link.client import vm_requirements

    mapped = vm_requirements({"id": VM, "memory": str(1 << 30), "cpu_pinning_policy": "isolate_threads",
                              "cpu": {"topology": {"sockets": "1", "cores": "4", "threads": "1"}}})
    assert (mapped["dedicated_cpus"], mapped["thread_policy"], mapped["numa"]) == (4, "isolate", "any")
    assert run(pool, [A, B], payload(hosts, mapped)).value == [B]


def test_the_weight_prefers_the_tightest_node_and_one_node_over_several(pool: PluginPool) -> None:
    wants = {VM: {"wanted": 4, "held": 0, "thread_policy": "prefer", "numa": "any"}}
    facts = payload({A: host(12, dedicated_nodes=nodes((6, 3, 6), (6, 3, 6)), dedicated_guests=wants),
                     B: host(5, dedicated_nodes=nodes((5, 2, 4))),
                     C: host(6, dedicated_nodes=nodes((3, 1, 2), (3, 1, 2))),
                     D: host(2, dedicated_nodes=nodes((1, 0, 0), (1, 0, 0)))})
    (result,) = pool.run([Call(*UNIT, "do_score", ([A, B, C, D], VM, {}), 10.0, facts)])
    weights = dict(result.value)
    assert weights[B] == 1 and weights[A] == 2 and weights[C] > weights[A]  # lower is better
    assert D not in weights  # no room: not scored, the call's worst weight
