"""The engine-reply rules of ENGINE-PROTOCOL.md, on the renderer alone."""

from vmsched.decide.rules import (
    ALL_FILTERS_FAILED,
    INT32_MAX,
    INT32_MIN,
    balance_decision,
    clamp_int32,
    discover_result,
    filter_decision,
    score_decision,
)
from vmsched.decide.weights import SCORE_BOUND
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


def test_integer_totals_in_the_bound_go_out_unchanged():
    outcomes = [ScoreOutcome(unit="s1", ok=True, factor=2, scores=[(H[0], 1), (H[1], 10), (H[2], 0)]),
                ScoreOutcome(unit="s2", ok=True, factor=3, scores=[(h, 5) for h in H[:3]])]
    d = score_decision(H[:3], outcomes)
    assert d.result == [[H[0], 17], [H[1], 35], [H[2], 15]]
    assert d.result_code == 0 and all(type(s) is int for _, s in d.result)


def test_fractional_totals_are_scaled_not_rounded_into_ties():
    # not half to even (0.5, 1.5, 2.5, 3.5 -> 0, 2, 2, 4): ties keep their order
    d = score_decision(H[:4], [ScoreOutcome(unit="s", ok=True, scores=list(zip(H, [0.5, 1.5, 2.5, 3.5])))])
    assert d.result == [[H[0], 1], [H[1], 2], [H[2], 3], [H[3], 4]]  # half up, differences kept
    d = score_decision(H[:3], [ScoreOutcome(unit="s", ok=True, scores=list(zip(H, [0.1, 0.2, 0.25])))])
    assert d.result == [[H[0], 1], [H[1], 2], [H[2], 3]]  # x10, the smallest scale that keeps them distinct


def test_huge_totals_keep_the_order_of_every_unit():
    # main clamped 1e12 and -1e12 to int32, erasing the small unit's order
    outcomes = [ScoreOutcome(unit="huge", ok=True, scores=[(H[0], 1e12), (H[1], 1e12), (H[2], -1e12)]),
                ScoreOutcome(unit="small", ok=True, scores=[(H[0], 2), (H[1], 1), (H[2], 0)])]
    d = score_decision(H[:3], outcomes)
    assert d.result == [[H[0], 2], [H[1], 1], [H[2], 0]]  # ranks: 1e12+2 > 1e12+1 > -1e12
    assert all(0 <= s <= SCORE_BOUND for _, s in d.result)


def test_wide_but_coarse_totals_are_scaled_down_into_the_bound():
    d = score_decision(H[:3], [ScoreOutcome(unit="s", ok=True, scores=[(H[0], 0), (H[1], 2**21), (H[2], 2**22)])])
    assert d.result == [[H[0], 0], [H[1], SCORE_BOUND // 2], [H[2], SCORE_BOUND]]


def test_negative_totals_are_shifted_not_clamped():
    d = score_decision(H[:3], [ScoreOutcome(unit="s", ok=True, scores=[(H[0], -3), (H[1], -1), (H[2], 2)])])
    assert d.result == [[H[0], 0], [H[1], 2], [H[2], 5]]


def test_a_host_the_unit_did_not_score_gets_its_worst_score():
    # main returned only H[0] here, so the three unscored hosts won with the engine's 0
    d = score_decision(H[:4], [ScoreOutcome(unit="s", ok=True, scores=[(H[0], 50)])])
    assert d.result == [[h, 50] for h in H[:4]]
    d = score_decision(H[:3], [ScoreOutcome(unit="s", ok=True, scores=[(H[1], 7), (H[2], 3)])])
    assert d.result == [[H[0], 7], [H[1], 7], [H[2], 3]]
    assert d.result_code == 0


def test_worst_follows_the_sign_of_the_factor():
    d = score_decision(H[:3], [ScoreOutcome(unit="s", ok=True, factor=-1, scores=[(H[1], 7), (H[2], 3)])])
    assert d.result == [[H[0], 4], [H[1], 0], [H[2], 4]]  # -3 is the worst contribution; shifted by -7


def test_non_finite_scores_are_reported_and_count_as_unscored():
    d = score_decision(H[:3], [ScoreOutcome(unit="s", ok=True, scores=[(H[0], float("nan")), (H[1], 1), (H[2], 2)])])
    assert d.result == [[H[0], 2], [H[1], 1], [H[2], 2]]
    assert "not a finite number" in d.plugin_errors["s"][0]


def test_failed_score_unit_reported_and_hosts_still_present():
    d = score_decision(H[:2], [ScoreOutcome(unit="s", ok=False, error="crashed", timed_out=False)])
    assert d.result == [[H[0], 0], [H[1], 0]] and d.plugin_errors == {"s": ["crashed"]} and d.result_code == 1


def test_duplicate_requested_hosts_appear_once():
    d = score_decision([H[0], H[1], H[0]], [ScoreOutcome(unit="s", ok=True, scores=[(H[0], 1), (H[1], 2)])])
    assert d.result == [[H[0], 1], [H[1], 2]]


def test_per_unit_triples_are_not_factored_and_encoded_per_unit():
    outcomes = [ScoreOutcome(unit="a", ok=True, factor=5, scores=[(H[0], 0.5), (H[1], 1.5)]),
                ScoreOutcome(unit="b", ok=True, factor=2, scores=[(H[1], 3)]),
                ScoreOutcome(unit="c", ok=False, error="boom")]
    d = score_decision(H[:2], outcomes, per_unit=True)
    assert d.result == [[H[0], 1, "a"], [H[1], 2, "a"], [H[0], 3, "b"], [H[1], 3, "b"]]
    assert d.plugin_errors == {"c": ["boom"]}
    only_failed = score_decision(H[:2], [ScoreOutcome(unit="c", ok=False, error="boom")], per_unit=True)
    assert only_failed.result == [[H[0], 0], [H[1], 0]]


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
