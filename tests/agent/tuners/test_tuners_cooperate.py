"""The tuners cooperate: placement first, weight and cap wait for a move that may relieve their CPUs, a weight or
cap change keeps the history placement needs, and dry-run reports as if the earlier proposals were in force."""

from __future__ import annotations

from vmsched.services.policy_agent.policy.model import parse_policy
from vmsched.services.policy_agent.tuners.config import TunerConfig
from vmsched.services.policy_agent.tuners.engine import Engine
from vmsched.services.policy_agent.tuners.types import Decision, GuestSample, GuestView, HostSample

SHARED = frozenset({0, 1, 2, 3})
ALL_THREE = {"vcpu_pins": {0: "1"}, "adaptive": {"may_move": True, "weight": [512, 4096], "cap_percent": [50, 100]}}
K = 3


def guest(uuid: str, policy: dict = ALL_THREE) -> GuestView:
    return GuestView(uuid, uuid, parse_policy(policy), 1, {0: frozenset({1})}, 1024, None, 100000)


def contended(views: list[GuestView]) -> tuple[dict[int, float], dict[str, GuestSample]]:
    """Two spinning 1-vCPU guests: sharing a CPU they each get half of it and wait the other half."""
    on: dict[int, list[str]] = {}
    for g in views:
        on.setdefault(min(g.pins[0]), []).append(g.uuid)
    host = {c: 100.0 if c in on else 90.0 for c in SHARED}  # a host busy with other work too: contention
    samples = {u: GuestSample(100.0 / len(us), 100.0 - 100.0 / len(us)) for us in on.values() for u in us}
    return host, samples


def rounds(engine: Engine, views: list[GuestView], n: int, apply: bool) -> list[tuple[int, Decision]]:
    out = []
    for i in range(1, n + 1):
        host, samples = contended(views)
        engine.observe(HostSample(host), samples)
        for d in engine.step(engine.input(SHARED, views)):
            out.append((i, d))
            if apply and d.outcome == "applied":  # as the agent applies them
                g = next(v for v in views if v.uuid == d.uuid)
                if d.field == "vcpus":
                    g.pins = {**g.pins, **d.after}
                elif d.field == "cpu_shares":
                    g.cpu_shares = d.after
                else:
                    g.cap_percent = d.after
    return out


def test_the_move_comes_first_and_no_cap_is_applied_while_it_may_relieve_the_contention() -> None:
    views = [guest("a"), guest("b")]
    log = rounds(Engine(TunerConfig(hysteresis=K)), views, 8, apply=True)
    applied = [(i, d) for i, d in log if d.outcome == "applied"]
    assert applied and applied[0][0] == K and applied[0][1].field == "vcpus"  # the earliest round: K samples
    assert [d.field for i, d in applied if i <= K] == ["vcpus"]  # no weight, no cap before it
    # the host stays busy with other work: the cap tuner acts after K fresh intervals of it, not before
    assert all(i >= 2 * K for i, d in applied if d.field == "vcpu_quota")
    held = [d for i, d in log if d.outcome == "deferred" and "held back" in d.reason]
    assert {d.field for d in held} >= {"cpu_shares", "vcpu_quota"}  # they were proposed, and waited
    assert min(views[0].pins[0]) != min(views[1].pins[0])


def test_dry_run_reports_the_move_as_early_and_the_rest_as_if_it_were_in_force() -> None:
    views = [guest("a"), guest("b")]
    log = rounds(Engine(TunerConfig(hysteresis=K, dry_run=True)), views, 2 * K + 1, apply=False)
    moves = [i for i, d in log if d.outcome == "dry_run" and d.field == "vcpus"]
    assert moves[0] == K and len(moves) >= 2  # never starved by the weight proposals that are never applied
    first = [d for i, d in log if i == K]
    mover = first[0].uuid
    assert first[0].field == "vcpus"
    # the same round, after the move: the mover's other changes wait their turn, the guest left behind's wait
    assert all(d.outcome == "deferred" for d in first[1:])
    assert any(d.uuid == mover and "rate limit" in d.reason for d in first[1:])
    assert any(d.uuid != mover and "held back" in d.reason for d in first[1:])
    assert not [d for i, d in log if d.outcome == "dry_run" and d.field != "vcpus"]


def test_a_weight_change_keeps_the_samples_placement_judges() -> None:
    policy = {"adaptive": {"may_move": True, "weight": [512, 4096], "target_wait_percent": 10}}
    e = Engine(TunerConfig(hysteresis=2))
    w = GuestView("w", "w", parse_policy(policy), 1, {0: SHARED}, 1024, None, 100000)  # on every shared CPU
    for _ in range(2):
        e.observe(HostSample({c: 40.0 for c in SHARED}), {"w": GuestSample(60, 30)})
        ds = e.step(e.input(SHARED, [w]))
    assert [(d.field, d.outcome) for d in ds] == [("cpu_shares", "applied")]
    e.observe(HostSample({c: 40.0 for c in SHARED}), {"w": GuestSample(60, 30)})
    (seen,) = e.input(SHARED, [w]).guests.values()
    assert len(seen.recent(2)) == 2  # placement still has its history
    assert seen.settled(2) is None  # the weight tuner waits K intervals again


def test_the_first_cap_decision_says_what_it_changed_from() -> None:
    policy = {"adaptive": {"cap_percent": [50, 100]}}  # no static cap: none in force yet
    e = Engine(TunerConfig(hysteresis=2))
    g = GuestView("c", "c", parse_policy(policy), 1, {0: SHARED}, 1024, None, 100000)
    for _ in range(2):
        e.observe(HostSample({c: 95.0 for c in SHARED}), {"c": GuestSample(90, None)})
        ds = e.step(e.input(SHARED, [g]))
    (d,) = ds
    assert (d.field, d.before, d.after) == ("vcpu_quota", 100, 90.0) and "cap 100% -> 90%" in d.reason
    assert d.view()["before"] == 100
