"""The pure tuners (tuners/): tuners on crafted samples, the guard, hysteresis, rate limits, dry-run,
and (hypothesis) that no applied decision ever leaves a guest's bounds, its static policy or the shared set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.services.policy_agent.policy.model import parse_policy
from vmsched.services.policy_agent.tuners.config import TunerConfig
from vmsched.services.policy_agent.tuners.engine import Engine
from vmsched.services.policy_agent.tuners.samples import VcpuCounters, guest_sample, vcpu_counters
from vmsched.services.policy_agent.tuners.state import TunedState
from vmsched.services.policy_agent.tuners.types import GuestSample, GuestView, HostSample, Proposal
from vmsched.services.policy_agent.policy.validation import Desired

SHARED = frozenset({0, 1, 2, 3})


def view(uuid: str, policy: dict, pins: dict[int, frozenset[int]] | None = None, shares: int = 1024,
         cap: float | None = None) -> GuestView:
    p = parse_policy(policy)
    pins = pins or {0: SHARED}
    return GuestView(uuid, uuid, p, len(pins), pins, shares, cap, 100000)


def run(engine: Engine, rounds: int, host: dict[int, float], guests: dict[str, GuestSample], views: list[GuestView]):
    decisions = []
    for _ in range(rounds):
        engine.observe(HostSample(host), guests)
        decisions += engine.step(engine.input(SHARED, views))
    return decisions


def test_hotspot_moves_the_most_waiting_guest_after_k_intervals():
    e = Engine(TunerConfig(hysteresis=3))
    pol = {"vcpu_pins": {0: "1"}, "adaptive": {"may_move": True, "target_wait_percent": 20}}
    a, b = view("a", pol, {0: frozenset({1})}), view("b", pol, {0: frozenset({1})})
    host = {0: 30.0, 1: 100.0, 2: 95.0, 3: 95.0}
    samples = {"a": GuestSample(50, 45), "b": GuestSample(50, 48)}
    assert run(e, 2, host, samples, [a, b]) == []  # the condition held only 2 intervals
    (d,) = run(e, 1, host, samples, [a, b])
    assert (d.uuid, d.field, d.outcome, d.after) == ("b", "vcpus", "applied", {0: frozenset({0})})
    assert "saturated for 3 intervals" in d.reason and "CPU 1 100%" in d.reason


def test_after_a_move_the_next_one_waits_k_fresh_intervals_of_the_host():
    """The interval of a move straddles it: CPU 1 still looks saturated and the guest left behind still looks
    as if it waited. It must not follow the first guest at once (on 2 CPUs the two would swap back and forth)."""
    e = Engine(TunerConfig(hysteresis=3))
    pol = {"vcpu_pins": {0: "1"}, "adaptive": {"may_move": True, "target_wait_percent": 20}}
    a, b = view("a", pol, {0: frozenset({1})}), view("b", pol, {0: frozenset({1})})
    host = {0: 30.0, 1: 100.0, 2: 95.0, 3: 95.0}
    samples = {"a": GuestSample(50, 45), "b": GuestSample(50, 48)}
    (d,) = run(e, 3, host, samples, [a, b])
    assert d.uuid == "b" and d.outcome == "applied"
    b = view("b", pol, d.after)  # in force now
    assert [x for x in run(e, 2, host, samples, [a, b]) if x.tuner == "hotspot"] == []  # 2 fresh intervals
    (again,) = [x for x in run(e, 1, host, samples, [a, b]) if x.tuner == "hotspot"]  # the 3rd: still hot
    assert again.uuid == "a"


def test_hotspot_leaves_a_guest_alone_below_its_wait_target_or_without_may_move():
    e = Engine(TunerConfig(hysteresis=2))
    host = {0: 10.0, 1: 100.0, 2: 10.0, 3: 10.0}
    calm = view("calm", {"adaptive": {"may_move": True, "target_wait_percent": 20}}, {0: frozenset({1})})
    fixed = view("fixed", {"adaptive": {"weight": [512, 4096]}}, {0: frozenset({1})})
    ds = run(e, 4, host, {"calm": GuestSample(90, 5), "fixed": GuestSample(90, 60)}, [calm, fixed])
    assert [d for d in ds if d.tuner == "hotspot"] == [] and {d.tuner for d in ds} == {"demand"}


def test_hotspot_without_wait_reported_needs_two_busy_vcpus_on_the_hot_cpu():
    e = Engine(TunerConfig(hysteresis=2))
    host = {0: 10.0, 1: 100.0, 2: 10.0, 3: 10.0}
    one = view("one", {"adaptive": {"may_move": True}}, {0: frozenset({1})})
    assert run(e, 3, host, {"one": GuestSample(99, None)}, [one]) == []
    two = view("two", {"adaptive": {"may_move": True}}, {0: frozenset({1})})
    ds = run(e, 2, host, {"one": GuestSample(99, None), "two": GuestSample(99, None)}, [one, two])
    assert [d.outcome for d in ds] == ["applied"] and "not reported" in ds[0].reason


def test_weight_rises_when_starved_and_decays_to_the_base_when_idle():
    e = Engine(TunerConfig(hysteresis=2))
    g = view("w", {"weight": 1000, "adaptive": {"weight": [500, 3000], "target_wait_percent": 10}}, shares=1000)
    (d,) = run(e, 2, {0: 50.0}, {"w": GuestSample(80, 30)}, [g])
    assert (d.field, d.before, d.after, d.outcome) == ("cpu_shares", 1000, 2000, "applied")
    g.cpu_shares = 2000
    assert run(e, 1, {0: 50.0}, {"w": GuestSample(80, 30)}, [g]) == []  # hysteresis again after a change
    (d,) = run(e, 1, {0: 50.0}, {"w": GuestSample(80, 30)}, [g])
    assert d.after == 3000  # clamped to the max
    g.cpu_shares = 3000
    assert run(e, 2, {0: 50.0}, {"w": GuestSample(80, 30)}, [g]) == []  # at the max: nothing to raise
    (d,) = run(e, 2, {0: 5.0}, {"w": GuestSample(1, 0)}, [g])  # idle for K intervals
    assert (d.after, d.reason.startswith("idle")) == (1500, True)
    g.cpu_shares = 1500
    (d,) = run(e, 2, {0: 5.0}, {"w": GuestSample(1, 0)}, [g])
    assert d.after == 1000  # never below the base


def test_weight_without_wait_uses_demand_against_the_cap():
    e = Engine(TunerConfig(hysteresis=2))
    g = view("c", {"cap_percent": 50, "adaptive": {"weight": [1024, 4096]}}, cap=50.0)
    (d,) = run(e, 2, {0: 50.0}, {"c": GuestSample(49.5, None)}, [g])
    assert d.after == 2048 and "at its cap" in d.reason


def test_elastic_cap_loosens_with_slack_and_tightens_under_contention():
    e = Engine(TunerConfig(hysteresis=2))
    g = view("e", {"cap_percent": 40, "adaptive": {"cap_percent": [20, 60]}}, cap=40.0)
    (d,) = run(e, 2, {c: 20.0 for c in SHARED}, {"e": GuestSample(40, None)}, [g])
    assert (d.field, d.after) == ("vcpu_quota", 50.0)
    g.cap_percent = 60.0
    (d,) = run(e, 2, {c: 95.0 for c in SHARED}, {"e": GuestSample(60, None)}, [g])
    assert d.after == 50.0  # back towards the base (40) first
    g.cap_percent = 40.0
    (d,) = run(e, 2, {c: 95.0 for c in SHARED}, {"e": GuestSample(40, None)}, [g])
    assert d.after == 30.0


def test_guard_refuses_out_of_bounds_dedicated_and_pool_proposals_with_reasons():
    e = Engine(TunerConfig(hysteresis=1), tuners={})
    w = view("w", {"adaptive": {"weight": [512, 2048], "may_move": True}})
    d = view("d", {"dedicated": "4-5", "adaptive": {"weight": [512, 2048]}}, {0: frozenset({4}), 1: frozenset({5})})
    e.observe(HostSample({}), {})
    out = e.step(e.input(SHARED, [w, d]), extra=[
        Proposal("w", "plug", "cpu_shares", 9999, "more"),
        Proposal("w", "plug", "vcpus", {0: frozenset({6})}, "into the pool"),
        Proposal("d", "plug", "vcpus", {0: frozenset({1})}, "move a dedicated guest"),
        Proposal("w", "plug", "vcpu_quota", 50.0, "no cap range"),
        Proposal("x", "plug", "cpu_shares", 600, "unknown guest"),
        Proposal("w", "plug", "colour", "red", "unknown field"),
    ])
    reasons = [x.reason for x in out]
    assert all(x.outcome == "refused" for x in out)
    assert "outside the guest's range [512, 2048]" in reasons[0]
    assert "outside the shared set" in reasons[1]
    assert "dedicated CPUs" in reasons[2]
    assert "no cap range" in reasons[3]
    assert "unknown guest" in reasons[4] and "unknown field" in reasons[5]


def test_rate_limits_and_dry_run():
    cfg = TunerConfig(hysteresis=1, max_changes=2, max_guest_changes=1, dry_run=True)
    e = Engine(cfg, tuners={})
    vs = [view(u, {"adaptive": {"weight": [512, 2048]}}) for u in "abc"]
    e.observe(HostSample({}), {})
    out = e.step(e.input(SHARED, vs), extra=[Proposal("a", "p", "cpu_shares", 600, "r"),
                                             Proposal("a", "p", "cpu_shares", 700, "r"),
                                             Proposal("b", "p", "cpu_shares", 600, "r"),
                                             Proposal("c", "p", "cpu_shares", 600, "r")])
    assert [x.outcome for x in out] == ["dry_run", "refused", "dry_run", "deferred"]
    assert "already changed" in out[1].reason and "per interval on the host" in out[3].reason


def test_samples_from_counters():
    rec = {"vcpu.current": 2, "vcpu.0.time": 2_000_000_000, "vcpu.1.time": 0, "vcpu.0.delay": 500_000_000,
           "vcpu.1.delay": 500_000_000}
    after = vcpu_counters(rec, 7)
    before = VcpuCounters(2, 0, 0, 7)
    s = guest_sample(before, after, 2.0)
    assert s == GuestSample(50.0, 25.0)
    assert guest_sample(VcpuCounters(2, 0, 0, 6), after, 2.0) is None  # another run of the guest
    assert vcpu_counters({"vcpu.current": 1, "vcpu.0.time": 5}, 1).wait_ns is None


def test_tuned_state_is_live_only_and_ends_with_the_run():
    st_ = TunedState()
    p = parse_policy({"weight": 1000, "adaptive": {"weight": [500, 3000]}})
    static = Desired({0: SHARED}, SHARED, {"cpu_shares": 1000})
    st_.set("u", 5, p, "cpu_shares", 2000)
    cfg, live = st_.split("u", static, 5, p, SHARED)
    assert cfg.sched["cpu_shares"] == 1000 and live.sched["cpu_shares"] == 2000
    assert st_.split("u", static, 6, p, SHARED) == (static, static)  # restarted: the static policy again
    assert st_.get("u") is None
    keep = parse_policy({"weight": 1000, "adaptive": {"weight": [500, 3000], "keep_on_restart": True}})
    st_.set("k", 5, keep, "cpu_shares", 2000)
    cfg, live = st_.split("k", static, 6, keep, SHARED)
    assert cfg.sched["cpu_shares"] == 2000 == live.sched["cpu_shares"]


bounds = st.tuples(st.integers(2, 10000), st.integers(2, 10000)).map(sorted)
caps = st.tuples(st.floats(1, 100), st.floats(1, 100)).map(sorted)
anything = st.one_of(st.integers(-5, 300000), st.floats(-10, 200), st.just(float("nan")), st.text(max_size=3),
                     st.none(), st.dictionaries(st.integers(-1, 4), st.frozensets(st.integers(0, 9), max_size=4), max_size=3))


@settings(max_examples=150, deadline=None)
@given(w=bounds, c=caps, may_move=st.booleans(), dedicated=st.booleans(),
       host=st.dictionaries(st.integers(0, 5), st.floats(0, 100), min_size=1),
       use=st.floats(0, 100), wait=st.one_of(st.none(), st.floats(0, 100)),
       plugin=st.lists(st.tuples(st.sampled_from(["cpu_shares", "vcpu_quota", "vcpus", "x"]), anything), max_size=4))
def test_applied_decisions_never_leave_the_bounds(w, c, may_move, dedicated, host, use, wait, plugin):
    w_lo, w_hi = w
    c_lo, c_hi = c
    c_lo = max(c_lo, 1.0)
    static = {"weight": w_lo, "cap_percent": c_hi,
              "adaptive": {"weight": [w_lo, w_hi], "cap_percent": [c_lo, c_hi], "may_move": may_move and not dedicated}}
    pins = {0: frozenset({1})}
    if dedicated:
        static["dedicated"] = "4-4"
        pins = {0: frozenset({4})}
    g = view("g", static, pins, shares=w_lo, cap=c_hi)
    e = Engine(TunerConfig(hysteresis=1, max_changes=100, max_guest_changes=100))
    e.observe(HostSample(host), {"g": GuestSample(use, wait)})
    extra = [Proposal("g", "plugin", f, v, "fuzz") for f, v in plugin]
    for d in e.step(e.input(SHARED, [g]), extra=extra):
        if d.outcome != "applied":
            assert (d.outcome == "refused" and d.reason.startswith("refused: ")) or \
                (d.outcome == "deferred" and d.reason.startswith("deferred: held back: a move off CPU 1"))
            continue
        if d.field == "cpu_shares":
            assert w_lo <= d.after <= w_hi
        elif d.field == "vcpu_quota":
            assert c_lo <= d.after <= c_hi
        else:
            assert d.field == "vcpus" and not dedicated and may_move
            assert all(cpus and cpus <= SHARED for cpus in d.after.values())


def test_hotspot_on_a_host_busy_everywhere_moves_only_competing_guests_to_a_cpu_without_them():
    e = Engine(TunerConfig(hysteresis=2))
    pol = {"adaptive": {"may_move": True}}
    host = {c: 100.0 for c in SHARED}
    a, b = view("a", pol, {0: frozenset({1})}), view("b", pol, {0: frozenset({1})})
    c = view("c", pol, {0: frozenset({0})})  # CPU 0 has a busy tuned vCPU: not a destination
    ds = run(e, 3, host, {"a": GuestSample(10, 90), "b": GuestSample(10, 80), "c": GuestSample(10, 90)}, [a, b, c])
    moved = [d for d in ds if d.tuner == "hotspot"]
    assert [(d.uuid, d.after[0]) for d in moved] == [("a", frozenset({2}))]
    assert "no busy tuned vCPU confined there" in moved[0].reason
    e2 = Engine(TunerConfig(hysteresis=2))
    alone = view("alone", pol, {0: frozenset({1})})  # waits, but only for other work: nowhere better to go
    assert [d for d in run(e2, 3, host, {"alone": GuestSample(10, 90)}, [alone]) if d.tuner == "hotspot"] == []
