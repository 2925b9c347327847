"""Policy schema, allocation, validation and dependency ordering (no libvirt; CPU sets: tests/agent/test_cpuset.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from vmsched import cpuset
from vmsched.services.policy_agent.policy import deps
from vmsched.services.policy_agent.policy.allocation import Pools
from vmsched.services.policy_agent.errors import PolicyError
from vmsched.services.policy_agent.policy.model import parse_policy
from vmsched.services.policy_agent.surfaces.cli import load_policy_file
from vmsched.services.policy_agent.policy.topology import flat
from vmsched.services.policy_agent.policy.validation import GuestInfo, check_policy, desired_for

S = cpuset.parse


# --- model -------------------------------------------------------------------
def test_policy_normalises_and_derives_sched():
    p = parse_policy({"vcpu_pins": {"0": "3,1-2"}, "emulator_pin": "0-1,^1", "weight": 512, "cap_percent": 50,
                      "requires": ["db", "db", "cache"]})
    assert p.vcpu_pins == {0: "1-3"}
    assert p.emulator_pin == "0"
    assert p.requires == ["db", "cache"]
    assert p.sched_params() == {"cpu_shares": 512, "vcpu_quota": 50000, "vcpu_period": 100000}
    assert parse_policy({"quota": 20000, "period": 40000}).sched_params() == {"vcpu_quota": 20000, "vcpu_period": 40000}
    assert parse_policy({"quota": -1}).sched_params() == {"vcpu_quota": -1}
    assert parse_policy({"dedicated": 2}).dedicated == 2
    assert parse_policy({"dedicated": "5,4"}).dedicated_set() == {4, 5}


@pytest.mark.parametrize(
    "data,fragment",
    [
        ({"weight": 1}, "weight (cpu_shares) 1 outside libvirt's range 2-262144"),
        ({"weight": 300000}, "outside libvirt's range"),
        ({"quota": 999}, "quota 999 us outside libvirt's range"),
        ({"quota": 5000, "period": 999}, "period 999 us outside libvirt's range 1000-1000000"),
        ({"cap_percent": 150}, "cap 150.0% outside (0, 100]"),
        ({"cap_percent": 0.5}, "below libvirt's minimum 1000 us"),
        ({"cap_percent": 50, "quota": 5000}, "not both"),
        ({"period": 5000}, "period given without cap_percent or quota"),
        ({"vcpu_pins": {"0": "1-"}}, "vcpu_pins"),
        ({"dedicated": 0}, "at least 1"),
        ({"dedicated": True}, "CPU count or a CPU set"),
        ({"bogus": 1}, "bogus"),
        ({"requires": [""]}, "empty guest name"),
    ],
)
def test_policy_rejects(data, fragment):
    with pytest.raises(PolicyError) as exc:
        parse_policy(data)
    assert fragment in str(exc.value)


def test_policy_files_roundtrip(tmp_path):
    p = parse_policy({"vcpu_pins": {0: "1"}, "dedicated": 2, "weight": 100, "requires": ["db"]})
    yml = tmp_path / "p.yaml"
    yml.write_text(yaml.safe_dump({"guest": "web", "policy": p.to_dict()}))
    assert load_policy_file(yml) == ("web", p)
    js = tmp_path / "p.json"
    js.write_text(json.dumps(p.to_dict()))
    assert load_policy_file(js) == (None, p)
    bad = tmp_path / "bad.yaml"
    bad.write_text("weight: 1\n")
    with pytest.raises(PolicyError, match="bad.yaml: weight"):
        load_policy_file(bad)
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy_file(tmp_path / "missing.yaml")


# --- allocation --------------------------------------------------------------
def pools(pool="4-7", **alloc) -> Pools:
    p = Pools(host_cpus=S("0-7"), pool=S(pool) if pool else frozenset())
    for name, cpus in alloc.items():
        p.assign(f"uuid-{name}", name, S(cpus))
    return p


def test_pool_views():
    p = pools(a="4-5")
    assert p.view() == {"host_cpus": "0-7", "dedicated_pool": "4-7", "shared": "0-3", "free": "6-7",
                        "allocated": "4-5", "allocations": {"a": "4-5"}}
    assert p.check_pool(S("6-9")) == ["dedicated pool 6-9: CPUs 8-9 do not exist on this host (CPUs 0-7)"]
    assert "at least one CPU must stay shared" in p.check_pool(S("0-7"))[0]


def test_count_allocation_keeps_current_and_takes_lowest_free():
    p = pools(a="4")
    assert p.request("uuid-b", "b", 2, 2) == S("5-6")
    p.assign("uuid-b", "b", S("6-7"))
    assert p.request("uuid-b", "b", 2, 2) == S("6-7")  # keeps what it holds
    assert p.request("uuid-b", "b", 3, 2) == S("5-7")
    with pytest.raises(PolicyError, match=r"asks for 4 dedicated CPUs but only 3 are free in the pool 4-7; allocated: 4 to 'a'"):
        p.request("uuid-b", "b", 4, 2)
    with pytest.raises(PolicyError, match="smaller than the guest's 2 vCPUs"):
        p.request("uuid-c", "c", 1, 2)


def test_explicit_allocation_errors_are_all_reported():
    p = pools(a="4-5")
    with pytest.raises(PolicyError) as exc:
        p.request("uuid-b", "b", S("2,5,9"), 4)
    msgs = exc.value.errors
    assert "dedicated set 2,5,9: CPU 9 does not exist on this host" in msgs
    assert "dedicated set 2,5,9: CPU 2 is not in the host's dedicated pool 4-7" in msgs
    assert "dedicated set 2,5,9: CPU 5 is already dedicated to guest 'a'" in msgs
    assert any("fewer than the guest's 4 vCPUs" in m for m in msgs)
    with pytest.raises(PolicyError, match="this host has no dedicated pool"):
        pools(pool="").request("u", "x", 1, 1)


def test_consistency_errors():
    p = pools(a="4-5", b="5-6")
    p.allocations["uuid-c"] = S("1")
    errs = p.consistency_errors()
    assert "CPU 5 is allocated to both 'a' and 'b'" in errs
    assert "guest 'c' holds CPU 1 outside the pool" in "\n".join(errs) or any("outside the pool" in e for e in errs)


# --- validation --------------------------------------------------------------
G = GuestInfo("uuid-g", "g", 2)


def check(policy: dict, p: Pools | None = None, graph=None, known=None):
    known = known or {"g": "uuid-g", "db": "uuid-db", "web": "uuid-web"}
    names = {v: k for k, v in known.items()}
    return check_policy(parse_policy(policy), G, p or pools(), graph or {},
                        lambda n: known.get(n) or (n if n in names else None), lambda u: names.get(u, u))


def test_dedicated_guest_pinned_one_to_one_emulator_shared():
    c = check({"dedicated": 2, "weight": 200})
    assert c.allocation == S("4-5")
    assert c.desired.vcpus == {0: S("4"), 1: S("5")}
    assert c.desired.emulator == S("0-3")
    assert c.desired.sched == {"cpu_shares": 200}


def test_shared_guest_defaults_to_shared_set_and_unmanaged_confined_only_with_pool():
    c = check({"vcpu_pins": {"1": "2"}})
    assert c.allocation is None
    assert c.desired.vcpus == {0: S("0-3"), 1: S("2")}
    assert desired_for(None, G, pools(), None).vcpus == {0: S("0-3"), 1: S("0-3")}
    assert desired_for(None, G, pools(pool=""), None).vcpus is None
    assert desired_for(None, G, pools(pool=""), None, confine=True).emulator == S("0-7")


def test_validation_reports_every_error_at_once():
    with pytest.raises(PolicyError) as exc:
        check({"vcpu_pins": {"0": "5", "1": "9", "3": "0"}, "emulator_pin": "6", "requires": ["g"]})
    msgs = exc.value.errors
    assert "vCPU 0 pin 5: CPU 5 is in the dedicated pool; a guest without dedicated CPUs runs on the shared set 0-3" in msgs
    assert "vCPU 1 pin 9: CPU 9 does not exist on this host (CPUs 0-7)" in msgs
    assert "vCPU 3 does not exist: guest 'g' has 2 vCPUs (0-1)" in msgs
    assert any(m.startswith("emulator pin 6: CPU 6 is in the dedicated pool") for m in msgs)
    assert "guest 'g' cannot require itself" in msgs


def test_dedicated_pins_must_stay_inside_allocation():
    with pytest.raises(PolicyError, match=r"vCPU 0 pin 0: CPU 0 is outside the guest's dedicated CPUs 4-5"):
        check({"dedicated": 2, "vcpu_pins": {"0": "0"}})
    c = check({"dedicated": "6-7", "vcpu_pins": {"0": "7", "1": "6"}, "emulator_pin": "6"})
    assert c.desired.vcpus == {0: S("7"), 1: S("6")} and c.desired.emulator == S("6")


def test_dependency_cycles_and_unknown_requirements():
    graph = {"uuid-db": ["uuid-web"], "uuid-web": ["uuid-g"]}
    with pytest.raises(PolicyError, match="dependency cycle: g -> db -> web -> g"):
        check({"requires": ["db"]}, graph=graph)
    c = check({"requires": ["nothere"]})
    assert c.warnings == ["required guest 'nothere' is not defined on this host (yet)"]


def test_start_and_stop_order():
    g = {"app": ["db", "cache"], "cache": ["db"], "web": ["app"], "db": []}
    assert deps.start_order(g, "web") == ["db", "cache", "app", "web"]
    assert deps.stop_order(g, "db") == ["web", "app", "cache", "db"]
    assert deps.find_cycle({"a": ["b"], "b": ["a"]}, "a") == ["a", "b", "a"]
    with pytest.raises(ValueError, match="dependency cycle"):
        deps.start_order({"a": ["b"], "b": ["a"]}, "a")


def test_counts_are_worded_for_one_and_for_many():
    one = GuestInfo("uuid-one", "one", 1)
    with pytest.raises(PolicyError) as exc:
        check_policy(parse_policy({"vcpu_pins": {"2": "1", "3": "1", "5": "1"}}), one, pools(), {}, lambda k: None, str)
    assert exc.value.errors == ["vCPUs 2-3,5 do not exist: guest 'one' has 1 vCPU (0)"]  # one line for them all
    with pytest.raises(PolicyError, match=r"^guest 'b' asks for 1 dedicated CPU but only 0 are free in the pool"):
        pools(a="4-7").request("uuid-b", "b", 1, 1)
    with pytest.raises(PolicyError, match=r"^guest 'b' asks for 2 dedicated CPUs but only 1 is free in the pool"):
        pools(a="4-6").request("uuid-b", "b", 2, 1)
    with pytest.raises(PolicyError, match=r"dedicated set 4 has 1 CPU, fewer than the guest's 2 vCPUs"):
        pools().request("uuid-b", "b", S("4"), 2)
    assert flat(S("0")).describe() == "1 socket, 1 core, 1 thread, 1 NUMA node"
    assert flat(S("0-3")).describe() == "1 socket, 4 cores, 4 threads, 1 NUMA node"
