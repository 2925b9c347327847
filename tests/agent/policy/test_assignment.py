"""Dedicated CPUs on servers' topologies: thread policies, NUMA policies, emulator isolation, and their refusals."""

from __future__ import annotations

import pytest

from tests.agent.recorded_host import capabilities
from vmsched.services.policy_agent.policy.allocation import Pools, plan_pool
from vmsched.cpuset import parse as S
from vmsched.services.policy_agent.errors import PolicyError
from vmsched.services.policy_agent.policy.model import parse_policy
from vmsched.services.policy_agent.policy.topology import parse_capabilities
from vmsched.services.policy_agent.policy.validation import GuestInfo, check_policy, desired_for


def pools(host: str, pool: str) -> Pools:
    t = parse_capabilities(capabilities(host))
    assert t is not None
    return Pools(t.online, S(pool), topology=t)


def take(p: Pools, name: str, nvcpus: int, **policy) -> frozenset[int]:
    cpus = p.request_for(f"uuid-{name}", name, parse_policy(policy), nvcpus)
    p.assign(f"uuid-{name}", name, cpus)
    return cpus


# --- one socket, 8 cores, SMT2: siblings N and N+8 ------------------------------------------------------
SMT = "intel-1s-8c-smt2"


def test_prefer_takes_whole_cores_then_threads_of_cores_in_use() -> None:
    p = pools(SMT, "1-7,9-15")
    assert take(p, "a", 3, dedicated=3) == S("1,2,9")  # core 1 whole, then one thread of core 2
    assert take(p, "b", 1, dedicated=1) == S("10")  # the other thread of core 2 before breaking core 3
    assert take(p, "c", 4, dedicated=4) == S("3-4,11-12")


def test_require_takes_whole_cores_only_and_holds_their_spare_threads() -> None:
    p = pools(SMT, "1-7,9-15")
    take(p, "a", 1, dedicated=1)  # prefer: one thread of core 1
    assert take(p, "r", 3, dedicated=3, thread_policy="require") == S("2-3,10-11")  # 2 whole cores, not core 1
    roles = p.roles(parse_policy({"dedicated": 3, "thread_policy": "require"}), S("2-3,10-11"), 3)
    assert roles.vcpus == (2, 10, 3)  # core by core: vCPUs 0 and 1 are siblings
    assert roles.reserved == frozenset()


def test_isolate_takes_one_thread_per_core_and_holds_the_siblings() -> None:
    p = pools(SMT, "1-7,9-15")
    held = take(p, "i", 2, dedicated=2, thread_policy="isolate")
    assert held == S("1-2,9-10")
    roles = p.roles(parse_policy({"dedicated": 2, "thread_policy": "isolate"}), held, 2)
    assert roles.vcpus == (1, 2) and roles.reserved == S("9-10")
    assert take(p, "x", 1, dedicated=1) == S("3")  # nobody gets 9 or 10


def test_half_cores_in_the_pool_serve_only_prefer() -> None:
    p = pools(SMT, "1-7")  # first threads only: no whole core in the pool
    with pytest.raises(PolicyError) as exc:
        take(p, "r", 2, dedicated=2, thread_policy="require")
    assert exc.value.errors == ["guest 'r' needs 1 whole core (2 CPUs, thread_policy require);"
                                " free CPUs on whole cores: node 0 has 0"]
    with pytest.raises(PolicyError, match="free whole cores: node 0 has 0"):
        take(p, "i", 1, dedicated=1, thread_policy="isolate")
    assert take(p, "p", 2, dedicated=2) == S("1-2")


def test_explicit_sets_follow_the_thread_policy() -> None:
    p = pools(SMT, "1-7,9-15")
    with pytest.raises(PolicyError, match=r"require needs whole cores; the core of CPUs 3,11 is only partly in it \(add 11\)"):
        take(p, "r", 2, dedicated="2-3,10", thread_policy="require")
    assert take(p, "r", 2, dedicated="2,10", thread_policy="require") == S("2,10")
    with pytest.raises(PolicyError, match="CPUs 4,12 are threads of one core"):
        take(p, "i", 2, dedicated="4,12", thread_policy="isolate")
    assert take(p, "i", 2, dedicated="4-5", thread_policy="isolate") == S("4-5,12-13")
    with pytest.raises(PolicyError, match="sibling threads 14 for this guest, but another guest holds them"):
        p.assign("uuid-z", "z", S("14"))
        take(p, "j", 1, dedicated="6", thread_policy="isolate")
    with pytest.raises(PolicyError, match="sibling threads 8 for this guest, but they are not in the dedicated pool"):
        take(p, "k", 1, dedicated="0", thread_policy="isolate")


# --- two sockets of 24 cores, two NUMA nodes ------------------------------------------------------------
TWO = "intel-2s-24c-smt2-2numa"
NODE0, NODE1 = S("0-23,48-71"), S("24-47,72-95")


def test_a_request_that_fits_one_node_stays_in_it() -> None:
    p = pools(TWO, "1-23,25-47,49-71,73-95")  # core 0 of each socket stays shared
    assert take(p, "a", 4, dedicated=4) <= NODE0
    big = take(p, "b", 60, dedicated=60)  # larger than a node: any spreads it
    assert big & NODE0 and big & NODE1 and len(big) == 60


def test_strict_refuses_with_every_nodes_room() -> None:
    p = pools(TWO, "1-23,25-47,49-71,73-95")
    take(p, "a", 40, dedicated=40, numa="strict")
    with pytest.raises(PolicyError) as exc:
        take(p, "b", 24, dedicated=24, thread_policy="isolate", numa="strict")
    assert exc.value.errors == [
        "guest 'b' needs 24 whole cores (one thread of each for it, the other threads held: thread_policy isolate)"
        " in one NUMA node (numa strict); free whole cores: node 0 has 3, node 1 has 23"]


def test_strict_takes_the_tightest_node_and_binds_memory() -> None:
    p = pools(TWO, "1-23,25-47,49-71,73-95")
    take(p, "a", 36, dedicated=36, numa="strict")  # node 0: 10 CPUs left, node 1: 46
    held = take(p, "b", 8, dedicated=8, numa="strict")
    assert held <= NODE0  # the tighter fit keeps node 1 whole for a big request
    policy = parse_policy({"dedicated": 8, "numa": "strict"})
    desired = desired_for(policy, GuestInfo("uuid-b", "b", 8), p, held)
    assert desired.memory_nodes == S("0")


def test_explicit_set_across_nodes_is_refused_by_strict() -> None:
    p = pools(TWO, "1-23,25-47,49-71,73-95")
    with pytest.raises(PolicyError, match="dedicated set 23,25 spans NUMA nodes 0, 1; numa strict needs one node"):
        take(p, "s", 2, dedicated="23,25", numa="strict")


def test_emulator_isolate_gets_a_cpu_of_its_own() -> None:
    p = pools(TWO, "1-23,25-47,49-71,73-95")
    policy = parse_policy({"dedicated": 2, "thread_policy": "isolate", "emulator": "isolate"})
    checked = check_policy(policy, GuestInfo("uuid-e", "e", 2), p, {}, lambda _: None, str)
    assert checked.allocation == S("1-3,49-51")  # 3 whole cores: 2 vCPUs and the emulator, siblings held
    assert checked.desired.vcpus == {0: S("1"), 1: S("2")} and checked.desired.emulator == S("3")
    with pytest.raises(PolicyError, match="CPU 49 is outside the guest's dedicated CPUs 1-2"):
        check_policy(policy.model_copy(update={"vcpu_pins": {0: "49"}}), GuestInfo("uuid-e", "e", 2), p, {},
                     lambda _: None, str)


# --- AMD EPYC, 4 NUMA nodes on one socket -------------------------------------------------------------
def test_epyc_strict_requests_fill_nodes_one_by_one() -> None:
    p = pools("amd-epyc-7452-nps4", "0-63")
    assert take(p, "a", 16, dedicated=16, numa="strict") == S("0-7,32-39")
    assert take(p, "b", 12, dedicated=12, numa="strict") == S("8-13,40-45")
    with pytest.raises(PolicyError) as exc:
        take(p, "c", 17, dedicated=17, numa="strict")
    assert exc.value.errors == ["guest 'c' needs 17 dedicated CPUs in one NUMA node (numa strict);"
                                " free: node 0 has 0, node 1 has 4, node 2 has 16, node 3 has 16"]


# --- offline CPUs -----------------------------------------------------------------------------------
def test_offline_threads_are_never_allocated() -> None:
    p = pools("intel-1s-8c-smt2-offline", "1-6,8,10-14")
    held = take(p, "r", 5, dedicated=5, thread_policy="require")
    assert held == S("1-3,10-11")  # core 1 keeps one thread online: a whole core of one thread
    assert p.request_for("uuid-r", "r", parse_policy({"dedicated": 5, "thread_policy": "require"}), 5) == held


def test_require_takes_no_core_beyond_the_need_and_keeps_what_it_got() -> None:
    """Four CPUs need two whole cores of two threads; the one-thread core 1 comes first but is not needed. Asked
    again, a guest keeps what it got (a core beyond the need made it move to other CPUs the second time)."""
    p = pools("intel-1s-8c-smt2-offline", "1-6,8,10-14")
    policy = {"dedicated": 4, "thread_policy": "require"}
    held = take(p, "r", 4, **policy)
    assert held == S("2-3,10-11")
    assert p.request_for("uuid-r", "r", parse_policy(policy), 4) == held
    # a guest holding the one-thread core asks for two CPUs: one whole core of two threads, not both cores
    p = pools("intel-1s-8c-smt2-offline", "1-6,8,10-14")
    take(p, "g", 1, dedicated=1)
    assert p.allocations["uuid-g"] == S("1")
    policy = {"dedicated": 2, "thread_policy": "require"}
    held = take(p, "g", 2, **policy)
    assert len(held) == 2 and p.request_for("uuid-g", "g", parse_policy(policy), 2) == held


# --- a pool change re-validates every allocation under these rules ------------------------------------------
def test_a_pool_change_keeps_whole_cores_or_names_every_guest() -> None:
    p = pools(SMT, "1-7,9-15")

    class G:
        def __init__(self, name: str, policy: dict, nvcpus: int) -> None:
            self.uuid, self.name, self.nvcpus, self.active = f"uuid-{name}", name, nvcpus, True
            self.policy = parse_policy(policy)

    guests = [G("r", {"dedicated": 2, "thread_policy": "require"}, 2), G("i", {"dedicated": 1, "thread_policy": "isolate"}, 1)]
    for g in guests:
        p.assign(g.uuid, g.name, p.request_for(g.uuid, g.name, g.policy, g.nvcpus))
    kept = plan_pool(p, S("1-7,9-15"), guests)
    assert kept.allocations == p.allocations  # the same pool: every guest keeps what it holds
    with pytest.raises(PolicyError) as exc:
        plan_pool(p, S("1-7"), guests)  # first threads only
    text = "; ".join(exc.value.errors)
    assert "guest 'r': guest 'r' needs 1 whole core" in text and "guest 'i': guest 'i' needs 1 whole core" in text


def test_field_rules() -> None:
    with pytest.raises(PolicyError, match="thread_policy require, numa strict: applies to dedicated CPUs"):
        parse_policy({"thread_policy": "require", "numa": "strict"})
    with pytest.raises(PolicyError, match="emulator isolate gives the emulator threads a dedicated CPU"):
        parse_policy({"dedicated": 2, "emulator": "isolate", "emulator_pin": "0"})
    with pytest.raises(PolicyError, match="thread_policy"):
        parse_policy({"dedicated": 2, "thread_policy": "always"})
    assert parse_policy({"dedicated": 2}).to_dict() == {"dedicated": 2}  # defaults are not written out
