"""The engine-reply rules of ENGINE-PROTOCOL.md, on the renderer alone."""

from vmsched.gateway.render import (
    ALL_FILTERS_FAILED,
    INT32_MAX,
    INT32_MIN,
    balance_decision,
    clamp_int32,
    discover_result,
    filter_decision,
    score_decision,
)
from vmsched.messages import BalanceOutcome, DiscoverReply, FilterOutcome, Kind, ScoreOutcome, UnitInfo

H = [f"00000000-0000-0000-0000-00000000000{i}" for i in range(1, 6)]
VM = "11111111-2222-3333-4444-555555555555"


def test_filter_intersection_keeps_input_order():
    outcomes = [FilterOutcome(unit="a", ok=True, hosts=[H[4], H[0], H[2], H[1]]),
                FilterOutcome(unit="b", ok=True, hosts=[H[2], H[4], H[1]])]
    d = filter_decision(H, outcomes)
    assert d.result == [H[1], H[2], H[4]]
    assert d.result_code == 0 and d.plugin_errors == {} and d.errors == []


def test_failed_filter_is_ignored_but_reported():
    outcomes = [FilterOutcome(unit="good", ok=True, hosts=[H[0]]),
                FilterOutcome(unit="bad", ok=False, error="ValueError: boom")]
    d = filter_decision(H, outcomes)
    assert d.result == [H[0]]
    assert d.plugin_errors == {"bad": ["ValueError: boom"]}
    assert d.result_code == 1


def test_every_filter_failing_keeps_all_hosts():
    outcomes = [FilterOutcome(unit="x", ok=False, error="timed out"),
                FilterOutcome(unit="y", ok=False, error="unknown filter unit 'y'")]
    d = filter_decision(H, outcomes)
    assert d.result == H
    assert d.errors == [ALL_FILTERS_FAILED]
    assert set(d.plugin_errors) == {"x", "y"}


def test_foreign_ids_are_dropped_and_reported():
    d = filter_decision(H[:2], [FilterOutcome(unit="f", ok=True, hosts=[H[0], "not-requested"])])
    assert d.result == [H[0]]
    assert "not-requested" in d.plugin_errors["f"][0]
    assert d.result_code == 1


def test_filter_returning_nothing_empties_result():
    d = filter_decision(H, [FilterOutcome(unit="f", ok=True, hosts=[])])
    assert d.result == [] and d.result_code == 0


def test_scores_factored_rounded_summed_and_clamped():
    outcomes = [ScoreOutcome(unit="s1", ok=True, factor=2, scores=[(H[0], 1.26), (H[1], 1e12), (H[2], -1e12)]),
                ScoreOutcome(unit="s2", ok=True, factor=3, scores=[(H[0], 0.5)])]
    d = score_decision(H, outcomes)
    assert d.result == [[H[0], 4], [H[1], INT32_MAX], [H[2], INT32_MIN]]  # 2*1.26 + 3*0.5 = 4.02
    assert all(isinstance(s, int) for _, s in d.result)


def test_host_missing_from_scores_stays_missing():
    d = score_decision(H[:3], [ScoreOutcome(unit="s", ok=True, scores=[(H[1], 7)])])
    assert d.result == [[H[1], 7]]


def test_failed_score_unit_reported():
    d = score_decision(H, [ScoreOutcome(unit="s", ok=False, error="crashed", timed_out=False)])
    assert d.result == [] and d.plugin_errors == {"s": ["crashed"]} and d.result_code == 1


def test_clamp_handles_infinities_and_nan():
    assert clamp_int32(float("inf")) == INT32_MAX
    assert clamp_int32(float("-inf")) == INT32_MIN
    assert clamp_int32(float("nan")) == 0
    assert clamp_int32(2.5) == 2 and clamp_int32(3.5) == 4  # round half to even


def test_balance_always_two_elements():
    ok = balance_decision(H, BalanceOutcome(unit="b", ok=True, vm=VM, hosts=[H[1], "elsewhere"]))
    assert ok.result == [VM, [H[1]]]
    assert "elsewhere" in ok.plugin_errors["b"][0]
    failed = balance_decision(H, BalanceOutcome(unit="b", ok=False, error="timed out after 1 s", timed_out=True))
    assert failed.result == ["", []] and failed.plugin_errors == {"b": ["timed out after 1 s"]}
    nothing = balance_decision(H, BalanceOutcome(unit="b", ok=True, vm="", hosts=[]))
    assert nothing.result == ["", []] and nothing.result_code == 0


def test_balance_refuses_a_vm_that_is_not_a_uuid():
    d = balance_decision(H, BalanceOutcome(unit="b", ok=True, vm="vm-one", hosts=[H[0]]))
    assert d.result == ["", []] and "not a UUID" in d.plugin_errors["b"][0]


def test_discover_has_exactly_three_keys_and_drops_invalid_validation():
    reply = DiscoverReply(units=[
        UnitInfo(name="F", kind=Kind.FILTER, description="f", validation="a=.*", plugin="p"),
        UnitInfo(name="S", kind=Kind.SCORE, description="s", validation="", plugin="p"),
        UnitInfo(name="Bad", kind=Kind.BALANCE, description="b", validation="", plugin="p",
                 validation_error="cannot translate"),
    ])
    out = discover_result(reply)
    assert out == {"filters": {"F": ["f", "a=.*"]}, "scores": {"S": ["s", ""]}, "balance": {}}
    assert discover_result(DiscoverReply()) == {"filters": {}, "scores": {}, "balance": {}}
