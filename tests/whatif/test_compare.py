"""Two decisions of one call compared: what the engine would act on, ties, ranks, units the candidate lacks."""

from __future__ import annotations

from vmsched.messages import BalanceOutcome, FilterOutcome, ScoreOutcome
from vmsched.whatif.compare import best, compare, decide, explain, ranks

H = ["h1", "h2", "h3"]
VM = "11111111-2222-3333-4444-555555555555"


def kept(*hosts: str, unit: str = "F", reasons: dict[str, str] | None = None) -> FilterOutcome:
    return FilterOutcome(unit=unit, ok=True, hosts=list(hosts), reasons=reasons or {})


def scored(*values: float, unit: str = "S", factor: int = 1) -> ScoreOutcome:
    return ScoreOutcome(unit=unit, ok=True, factor=factor, scores=list(zip(H, values)))


def test_a_filter_changes_when_it_keeps_other_hosts_and_says_which():
    same = compare("filter", H, decide("filter", H, [kept("h1", "h2")]), decide("filter", H, [kept("h2", "h1")]))
    assert same.status == "same"
    other = compare("filter", H, decide("filter", H, [kept("h1", "h2")]),
                    decide("filter", H, [kept("h1", "h3", reasons={"h2": "full"})]))
    assert other.changed and other.what == "keeps 2 hosts (baseline 2): also keeps h3; drops h2"
    rows = explain("filter", H, decide("filter", H, [kept("h1", "h3", reasons={"h2": "full"})]))
    assert rows["h2"] == {"F": "dropped: full", "result": "dropped"} and rows["h3"]["result"] == "kept"


def test_a_failing_unit_drops_nothing_and_shows_as_failed():
    failed = FilterOutcome(unit="F", ok=False, error="boom")
    side = decide("filter", H, [failed, kept("h1", "h2", unit="G")])
    assert side.decision.result == ["h1", "h2"] and explain("filter", H, side)["h3"]["F"] == "failed"


def test_scores_compare_by_the_best_ranked_hosts_with_ties_and_the_rank_the_old_best_now_has():
    base = decide("score", H, [scored(1, 5, 9)])
    assert best(base) == ["h1"] and ranks(base) == {"h1": 1, "h2": 2, "h3": 3}
    same = compare("score", H, base, decide("score", H, [scored(0, 7, 8)]))
    assert same.status == "same" and same.rank == 1 and not same.tie
    flipped = compare("score", H, base, decide("score", H, [scored(1, 5, 9, factor=-1)]))
    assert flipped.changed and flipped.rank == 3 and "instead of h1" in flipped.what
    assert "its selector may still choose otherwise" in flipped.what
    tied = compare("score", H, base, decide("score", H, [scored(2, 2, 9)]))
    assert tied.changed and tied.tie and tied.rank == 1 and "(tied)" in tied.what


def test_a_balance_changes_with_another_vm_or_other_destinations():
    move = BalanceOutcome(unit="B", ok=True, vm=VM, hosts=["h2", "h3"])
    base = decide("balance", H, [move])
    assert compare("balance", H, base, decide("balance", H, [move.model_copy(update={"hosts": ["h3", "h2"]})])).status == "same"
    none = compare("balance", H, base, decide("balance", H, [BalanceOutcome(unit="B", ok=True)]))
    assert none.changed and none.what == f"proposes no migration instead of migrating {VM} to h2, h3"


def test_a_unit_the_candidate_lacks_is_unknown_not_a_change():
    lacking = FilterOutcome(unit="G", ok=False, error="unknown filter unit 'G'")
    base = decide("filter", H, [kept("h1"), kept("h1", "h2", unit="G")])
    cand = decide("filter", H, [kept("h1"), lacking], unknown=["G"])
    found = compare("filter", H, base, cand)
    assert found.status == "unknown" and found.unknown == ["G"] and "lacks G" in found.what
    assert compare("filter", H, cand, cand).status == "same"  # lacking on both sides: nothing to tell
