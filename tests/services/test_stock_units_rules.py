"""The rules every stock balancer keeps, checked on each of them with crafted facts:

- it never proposes a VM with dedicated CPUs, or one whose vmsched policy pins it;
- it never proposes a destination that would cross its threshold after the move;
- it acts on fresh facts only: a stale host is neither a source nor a destination.

Each case starts from a scenario in which the balancer does move a guest (so
the rule, not a quiet balancer, is what makes the answer empty).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from vmsched.config import stock_plugins_dir
from vmsched.runtime import Call, PluginPool
from vmsched.runtime.types import Confinement

SRC, DST, NEAR = "aaaaaaaa-0000-0000-0000-000000000001", "aaaaaaaa-0000-0000-0000-000000000002", \
    "aaaaaaaa-0000-0000-0000-000000000003"


def guest(n: int, **extra: Any) -> dict[str, Any]:
    return {"uuid": f"cccccccc-0000-0000-0000-{n:012d}", "state": "running", "memory_mib": 512, "vcpus": 2,
            "cpu_pct": 50.0, **extra}


def cpu(pct: float, **extra: Any) -> dict[str, Any]:
    return {"cpu_pct": pct, "cpu_history": [pct] * 30, "history_interval": 5.0, "cpus": 8,
            "memory_free_mib": 20000, **extra}


# balancer -> (plugin, unit, properties, {host: facts without guests}, guests on the source)
# NEAR is a fresh host the move would push over the unit's threshold: never a destination.
CASES: dict[str, tuple[str, str, dict[str, str], dict[str, dict], int]] = {
    "even guests": ("vmsched_even_guests", "vmsched_EvenGuestDistribution",
                    {"HighVmCount": "3", "MigrationThreshold": "2"},
                    {SRC: {"guests_running": 5}, DST: {"guests_running": 0}, NEAR: {"guests_running": 3}}, 5),
    "cpu even": ("vmsched_cpu_memory_weights", "vmsched_CpuEvenDistribution", {},  # 12.5 % more on 8 CPUs
                 {SRC: cpu(95), DST: cpu(10), NEAR: cpu(75)}, 4),
    "cpu power saving": ("vmsched_cpu_memory_weights", "vmsched_CpuPowerSaving", {},
                         {SRC: cpu(5), DST: cpu(50), NEAR: cpu(75)}, 1),
    "memory even": ("vmsched_cpu_memory_weights", "vmsched_MemoryEvenDistribution",
                    {"MaxFreeMemoryForOverUtilized": "2000", "MinFreeMemoryForUnderUtilized": "2000"},
                    {SRC: {"memory_free_mib": 1000}, DST: {"memory_free_mib": 20000},
                     NEAR: {"memory_free_mib": 2300}}, 3),  # 2300 - 512 < 2000
}


@pytest.fixture(scope="module")
def pool() -> Iterator[PluginPool]:
    pool = PluginPool(stock_plugins_dir(), size=1, name=f"rules-{uuid.uuid4().hex[:8]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    yield pool
    pool.close()


def balance(pool: PluginPool, case: str, guests: list[dict], stale: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    plugin, unit, props, hosts, _ = CASES[case]
    views = {h: {**v, "stale": h in stale, "guests": guests if h == SRC else []} for h, v in hosts.items()}
    facts = {"hosts": views, "missing": {}, "vm": None, "vm_problem": "a balance call"}
    (result,) = pool.run([Call(plugin, unit, "do_balance", (list(hosts), props), 10.0, facts)])
    assert result.ok, result.error
    vm, targets = result.value[0], result.value[1]
    return vm or "", list(targets)


@pytest.mark.parametrize("case", sorted(CASES))
def test_balancer_moves_a_plain_guest_to_a_host_that_stays_under_its_threshold(pool: PluginPool, case: str) -> None:
    plain = [guest(i + 1) for i in range(CASES[case][4])]
    vm, targets = balance(pool, case, plain)
    assert vm in {g["uuid"] for g in plain} and targets == [DST]  # never NEAR


@pytest.mark.parametrize("case", sorted(CASES))
def test_balancer_never_proposes_a_dedicated_or_pinned_guest(pool: PluginPool, case: str) -> None:
    count = CASES[case][4]
    kinds = [{"dedicated": True, "dedicated_cpus": 2, "has_policy": True},
             {"has_policy": True, "pinned": True}]
    held = [guest(i + 1, **kinds[i % 2]) for i in range(count)]
    assert balance(pool, case, held) == ("", [])
    mixed = held[:-1] + [guest(count + 1)]  # one plain guest among them: that one, if any
    vm, targets = balance(pool, case, mixed)
    assert vm in ("", mixed[-1]["uuid"]) and vm not in {g["uuid"] for g in held}


@pytest.mark.parametrize("case", sorted(CASES))
def test_balancer_uses_fresh_hosts_only(pool: PluginPool, case: str) -> None:
    plain = [guest(i + 1) for i in range(CASES[case][4])]
    assert balance(pool, case, plain, stale=(SRC,)) == ("", [])  # a stale source
    assert balance(pool, case, plain, stale=(DST,)) == ("", [])  # the one destination is stale; NEAR crosses
