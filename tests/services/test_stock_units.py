"""The stock units (plugins/vmsched_*.py) on crafted host facts, with oVirt's parameter defaults.

Each call runs in a real plugin worker, in the sandbox, with facts in the full
form (the shape of a ``vmsched plugin run --facts`` file).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from vmsched.config import stock_plugins_dir
from vmsched.decide.rules import score_decision
from vmsched.messages import ScoreOutcome
from vmsched.runtime import Call, PluginPool
from vmsched.runtime.contract import KIND
from vmsched.runtime.types import Confinement

A, B, C, D, E = (f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(1, 6))
VM = "11111111-2222-3333-4444-555555555555"


@pytest.fixture(scope="module")
def pool() -> Iterator[PluginPool]:
    pool = PluginPool(stock_plugins_dir(), size=2, name=f"stock-{uuid.uuid4().hex[:8]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    yield pool
    pool.close()


def run(pool: PluginPool, plugin: str, unit: str, kind: str, hosts: list[str], facts: dict[str, Any],
        props: dict[str, str] | None = None) -> Any:
    k = KIND[kind]
    (result,) = pool.run([Call(plugin, unit, k.method, k.args(hosts, VM, props or {}), 10.0, facts)])
    assert result.ok, result.error
    return k.check(result.value, hosts)


def payload(hosts: dict[str, dict], vm: dict | None = None) -> dict[str, Any]:
    return {"hosts": hosts, "missing": {}, "vm": vm, "vm_problem": None if vm else "unknown VM"}


# --- filters -----------------------------------------------------------------------------

def test_memory_keeps_hosts_whose_free_memory_minus_reserve_covers_vm_plus_overhead(pool: PluginPool):
    need = 4096 + 65 + 321  # the VM, oVirt's guest overhead and host reserve defaults
    facts = payload({A: {"memory_free_mib": need}, B: {"memory_free_mib": need - 1},
                     D: {"memory_free_mib": 10, "stale": True}, E: {"memory_free_mib": 10}},
                    vm={"id": VM, "memory_mib": 4096, "host_id": E})
    hosts = [A, B, C, D, E]
    assert run(pool, "vmsched_memory", "vmsched_Memory", "filter", hosts, facts) == [A, C, D, E]
    k = KIND["filter"]  # and it says why it dropped B
    (result,) = pool.run([Call("vmsched_memory", "vmsched_Memory", k.method, k.args(hosts, VM, {}), 10.0, facts)])
    assert k.read(result.value, hosts).reasons == {B: "free 4160 MiB < 4161 MiB needed"}
    assert run(pool, "vmsched_memory", "vmsched_Memory", "filter", hosts, facts,
               {"HostReservedMemoryMiB": "0", "GuestOverheadMiB": "0"}) == hosts
    unknown_vm = payload({B: {"memory_free_mib": 1}})
    assert run(pool, "vmsched_memory", "vmsched_Memory", "filter", [A, B], unknown_vm) == [A, B]


def test_cpu_overloaded_drops_hosts_long_above_high_utilization(pool: PluginPool):
    minute = {"history_interval": 60}
    facts = payload({A: {**minute, "cpu_history": [10, 90, 95, 99]},  # 3 minutes above 80
                     B: {**minute, "cpu_history": [90, 70, 81, 85]},  # 2 minutes: exactly the default
                     C: {**minute, "cpu_history": [90, 90, 70, 99]},  # 1 minute
                     D: {**minute, "cpu_history": [99, 99, 99], "stale": True}})
    hosts = [A, B, C, D, E]
    assert run(pool, "vmsched_cpu_overloaded", "vmsched_CpuOverloaded", "filter", hosts, facts) == [C, D, E]
    assert run(pool, "vmsched_cpu_overloaded", "vmsched_CpuOverloaded", "filter", hosts, facts,
               {"CpuOverCommitDurationMinutes": "3"}) == [B, C, D, E]
    assert run(pool, "vmsched_cpu_overloaded", "vmsched_CpuOverloaded", "filter", hosts, facts,
               {"HighUtilization": "95"}) == [A, B, C, D, E]  # only 99 is above 95, for one minute


def test_swap_drops_hosts_over_maximum_allowed_swap_usage(pool: PluginPool):
    facts = payload({A: {"memory_total_mib": 10000, "swap_used_mib": 2000},  # 20 %: the default, kept
                     B: {"memory_total_mib": 10000, "swap_used_mib": 2001},
                     C: {"memory_total_mib": 0, "swap_used_mib": 50}})
    assert run(pool, "vmsched_swap", "vmsched_Swap", "filter", [A, B, C, D], facts) == [A, C, D]
    assert run(pool, "vmsched_swap", "vmsched_Swap", "filter", [A, B, C, D], facts,
               {"MaximumAllowedSwapUsage": "10"}) == [C, D]


# --- weight ------------------------------------------------------------------------------

def test_even_guest_distribution_weight(pool: PluginPool):
    facts = payload({A: {"guests_running": 3}, B: {"guests_running": 1}, C: {"guests_running": 0, "stale": True}})
    scores = run(pool, "vmsched_even_guests", "vmsched_EvenGuestDistribution", "score", [A, B, C, D], facts)
    assert scores == [(A, 3.0), (B, 1.0)]
    sent = score_decision([A, B, C, D], [ScoreOutcome(unit="vmsched_EvenGuestDistribution", ok=True, scores=scores)])
    assert sent.result == [[A, 3], [B, 1], [C, 3], [D, 3]]  # hosts without fresh facts: the worst, never the best


# --- balancer ----------------------------------------------------------------------------

def guests(n: int, **first: dict) -> list[dict]:
    out = [{"uuid": f"cccccccc-0000-0000-0000-{i:012d}", "state": "running", "memory_mib": 4096} for i in range(n)]
    for i, extra in enumerate(first.values()):
        out[i].update(extra)
    return out


def test_even_guest_distribution_balancer(pool: PluginPool):
    busy = guests(12, a={"dedicated": True, "memory_mib": 512}, b={"has_policy": True, "memory_mib": 512},
                  c={"memory_mib": 1024}, d={"state": "paused", "memory_mib": 256})
    facts = payload({A: {"guests_running": 12, "guests": busy},
                     B: {"guests_running": 2, "guests": guests(2)},
                     C: {"guests_running": 6, "guests": guests(6)},  # 12 - 6 >= 5 and 6 + 1 <= 10
                     D: {"guests_running": 9, "guests": guests(9)},  # only 3 fewer: not a destination
                     E: {"guests_running": 0, "guests": [], "stale": True}})  # stale: takes no part
    unit = ("vmsched_even_guests", "vmsched_EvenGuestDistribution", "balance")
    assert run(pool, *unit, [A, B, C, D, E], facts) == (busy[2]["uuid"], [B, C])  # the smallest movable guest
    assert run(pool, *unit, [A, B, C, D, E], facts, {"HighVmCount": "12"}) == ("", [])  # nobody over the bound
    assert run(pool, *unit, [A, B, C, D, E], facts, {"MigrationThreshold": "11"}) == ("", [])  # 12 - 2 < 11


def test_even_guest_balancer_never_moves_pinned_or_dedicated_guests_nor_uses_stale_hosts(pool: PluginPool):
    pinned = guests(12, a={"dedicated": True}, b={"has_policy": True})[:2]
    facts = payload({A: {"guests_running": 12, "guests": pinned}, B: {"guests_running": 0, "guests": []}})
    unit = ("vmsched_even_guests", "vmsched_EvenGuestDistribution", "balance")
    assert run(pool, *unit, [A, B], facts) == ("", [])
    stale_source = payload({A: {"guests_running": 20, "guests": guests(20), "stale": True},
                            B: {"guests_running": 0, "guests": []}})
    assert run(pool, *unit, [A, B], stale_source) == ("", [])


def test_max_vms_drops_hosts_at_the_cap(pool: PluginPool):
    facts = payload({A: {"guests_running": 99}, B: {"guests_running": 100}, C: {"guests_running": 500, "stale": True}})
    assert run(pool, "vmsched_max_vms", "vmsched_MaxVms", "filter", [A, B, C, D], facts) == [A, C, D]
    assert run(pool, "vmsched_max_vms", "vmsched_MaxVms", "filter", [A, B, C, D], facts, {"MaxVmCount": "5"}) == [C, D]


# --- more weights (oVirt's CPU and memory ones, the two Trimaran-like ones) ----------------------------

def scores_of(pool: PluginPool, plugin: str, unit: str, facts: dict, props: dict | None = None) -> dict[str, float]:
    return dict(run(pool, plugin, unit, "score", [A, B, C, D], facts, props))


def test_cpu_weights(pool: PluginPool):
    minute = {"history_interval": 60}
    facts = payload({A: {**minute, "cpu_history": [0, 0, 10, 30]},  # the last 2 minutes: 20 %
                     B: {**minute, "cpu_history": [90, 90, 70, 70]},  # 70 %
                     C: {"cpu_pct": 95.0},  # no history: the last interval
                     D: {"cpu_pct": 1.0, "stale": True}})
    assert scores_of(pool, "vmsched_cpu_memory_weights", "vmsched_CpuEvenDistribution", facts) == {A: 20, B: 70, C: 95}
    saving = scores_of(pool, "vmsched_cpu_memory_weights", "vmsched_CpuPowerSaving", facts)
    assert saving == {A: 60, B: 10, C: 1095}  # B: busiest under HighUtilization 80 is best; C over it is worst


def test_memory_weights(pool: PluginPool):
    facts = payload({A: {"memory_free_mib": 1000}, B: {"memory_free_mib": 9000}, C: {"memory_free_mib": 200}})
    assert scores_of(pool, "vmsched_cpu_memory_weights", "vmsched_MemoryEvenDistribution", facts) == {
        A: -1000, B: -9000, C: -200}
    saving = scores_of(pool, "vmsched_cpu_memory_weights", "vmsched_MemoryPowerSaving", facts,
                       {"MaxFreeMemoryForOverUtilized": "500"})
    assert min(saving, key=saving.get) == A and max(saving, key=saving.get) == C  # C keeps too little free


def test_target_load_packing_prefers_hosts_near_the_target(pool: PluginPool):
    facts = payload({A: {"cpu_pct": 0.0}, B: {"cpu_pct": 40.0}, C: {"cpu_pct": 20.0}, D: {"cpu_pct": 90.0}})
    weights = scores_of(pool, "vmsched_load_aware", "vmsched_TargetLoadPacking", facts)
    assert sorted(weights, key=weights.get) == [B, C, A, D]  # at 40 % best, empty next, far over the target last
    assert weights[B] == 0 and weights[A] == 60


def test_load_variation_risk_counts_the_variance(pool: PluginPool):
    facts = payload({A: {"history_interval": 60, "cpu_history": [10, 50, 10, 50], "memory_total_mib": 100,
                         "memory_free_mib": 90},  # mean 30, stdev 20
                     B: {"history_interval": 60, "cpu_history": [35, 35, 35, 35], "memory_total_mib": 100,
                         "memory_free_mib": 90},
                     C: {"cpu_pct": 5.0, "memory_total_mib": 100, "memory_free_mib": 20}})  # memory 80 % used
    weights = scores_of(pool, "vmsched_load_aware", "vmsched_LoadVariationRisk", facts)
    assert weights == {A: 50, B: 35, C: 80}
    assert scores_of(pool, "vmsched_load_aware", "vmsched_LoadVariationRisk", facts, {"SafeVarianceMargin": "0"})[A] == 30


# --- CPU and memory balancers -------------------------------------------------------------------

def guest(n: int, **extra: Any) -> dict:
    return {"uuid": f"dddddddd-0000-0000-0000-{n:012d}", "state": "running", "vcpus": 2, "memory_mib": 2048,
            "cpu_pct": 10.0, **extra}


def test_cpu_balancer_moves_the_busiest_guest_off_an_overloaded_host(pool: PluginPool):
    minute = {"history_interval": 60, "cpus": 8}
    hot_guests = [guest(1, cpu_pct=80.0), guest(2, cpu_pct=90.0, dedicated=True), guest(3, cpu_pct=5.0)]
    facts = payload({A: {**minute, "cpu_history": [95, 95, 95], "guests": hot_guests},  # 3 min over 80
                     B: {**minute, "cpu_history": [30, 30, 30], "guests": []},  # 30 + 80*2/8 = 50: fits
                     C: {**minute, "cpu_history": [70, 70, 70], "guests": []},  # 70 + 20 = 90: would cross 80
                     D: {**minute, "cpu_history": [0, 0, 0], "guests": [], "stale": True}})
    unit = ("vmsched_cpu_memory_weights", "vmsched_CpuEvenDistribution", "balance")
    assert run(pool, *unit, [A, B, C, D], facts) == (hot_guests[0]["uuid"], [B])  # never the dedicated one
    assert run(pool, *unit, [A, B, C, D], facts, {"CpuOverCommitDurationMinutes": "4"}) == ("", [])  # not long enough


def test_cpu_balancer_falls_back_to_memory_and_memory_balancer(pool: PluginPool):
    small, big = guest(1, memory_mib=1024), guest(2, memory_mib=8192)
    facts = payload({A: {"cpu_pct": 10.0, "memory_free_mib": 500, "guests": [big, small]},  # short of memory
                     B: {"cpu_pct": 10.0, "memory_free_mib": 6000, "guests": []},
                     C: {"cpu_pct": 10.0, "memory_free_mib": 1400, "guests": []}})  # 1400 - 1024 < 1000 after
    props = {"MaxFreeMemoryForOverUtilized": "1000", "MinFreeMemoryForUnderUtilized": "4000"}
    for unit in (("vmsched_cpu_memory_weights", "vmsched_CpuEvenDistribution", "balance"),
                 ("vmsched_cpu_memory_weights", "vmsched_MemoryEvenDistribution", "balance")):
        assert run(pool, *unit, [A, B, C], facts, props) == (small["uuid"], [B])
        assert run(pool, *unit, [A, B, C], facts) == ("", [])  # no memory threshold set: no migration (as oVirt)


def test_power_saving_balancer_empties_an_idle_host_into_busier_ones(pool: PluginPool):
    minute = {"history_interval": 60, "cpus": 8, "memory_free_mib": 50000}
    idle_guests = [guest(1, memory_mib=4096), guest(2, memory_mib=1024), guest(3, memory_mib=512, has_policy=True)]
    facts = payload({A: {**minute, "cpu_history": [5, 5, 5], "guests": idle_guests},  # idle for 3 minutes
                     B: {**minute, "cpu_history": [60, 60, 60], "guests": [guest(4)]},  # 60 + 2.5 <= 80
                     C: {**minute, "cpu_history": [79, 79, 79], "guests": [guest(5)]},  # 79 + 2.5 > 80
                     D: {**minute, "cpu_history": [40, 40, 40], "guests": [], "memory_free_mib": 100}})  # no room
    unit = ("vmsched_cpu_memory_weights", "vmsched_CpuPowerSaving", "balance")
    assert run(pool, *unit, [A, B, C, D], facts) == (idle_guests[1]["uuid"], [B])  # smallest movable, to B
    assert run(pool, *unit, [A, B, C, D], facts, {"LowUtilization": "4"}) == ("", [])  # nobody idle
