"""Score summaries: ties named, units that scored no host counted as such and why, weights sent per unit, and
summaries shortened by whole words and items only (an ID is never cut)."""

from __future__ import annotations

import re
from typing import Any

from tests.support.decisions import build
from vmsched.decide.rules import filter_decision, score_decision
from vmsched.messages import FilterOutcome, FilterRequest, MissingFacts, ScoreOutcome, ScoreRequest

H = [f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(5)]
VM = "11111111-2222-3333-4444-555555555555"
NO_AGENT = "no agent reports them"


def _score(outcomes: list[ScoreOutcome], hosts: list[str] = H[:3], per_unit: bool = False,
           missing: MissingFacts | None = None) -> dict[str, Any]:
    req = ScoreRequest.model_validate({"units": [{"name": o.unit, "factor": o.factor} for o in outcomes],
                                       "hosts": hosts, "vm": VM})
    decision = score_decision(hosts, outcomes, per_unit=per_unit)
    decision.missing_facts = missing
    return build("score", req, decision, outcomes, bus_failed=False, gateway="gw-a", duration=0.1)


def test_a_tie_for_the_lowest_weight_names_every_best_host() -> None:
    outcomes = [ScoreOutcome(unit="Guests", ok=True, scores=[(H[0], 2.0), (H[1], 3.0), (H[2], 2.0)])]
    assert _score(outcomes)["summary"] == (f"best {H[0]} and {H[2]}, tied at weight 2, of 3 scored hosts: "
                                           "1 of 1 units scored")
    every = [ScoreOutcome(unit="Same", ok=True, scores=[(h, 1.0) for h in H])]
    assert _score(every, hosts=H)["summary"].startswith(
        f"best {H[0]}, {H[1]}, {H[2]} and 2 more, tied at weight 1, of 5 scored hosts: ")


def test_a_unit_that_scored_no_host_is_counted_as_such_and_says_why() -> None:
    outcomes = [ScoreOutcome(unit="Guests", ok=True, scores=[(H[0], 1.0), (H[1], 3.0), (H[2], 2.0)]),
                ScoreOutcome(unit="vmsched_Memory", ok=True, scores=[]),
                ScoreOutcome(unit="Empty", ok=True, scores=[]),
                ScoreOutcome(unit="Elsewhere", ok=True, scores=[("not-asked", 1.0)])]
    summary = _score(outcomes, missing=MissingFacts(units=["vmsched_Memory"], hosts={NO_AGENT: H[:3]}))["summary"]
    assert summary == (f"best {H[0]} (weight 1, lowest) of 3 scored hosts: 1 of 4 units scored; vmsched_Memory "
                       "scored no host (no facts); Empty scored no host (no scores returned); Elsewhere scored no "
                       f"host (only hosts not asked for); no facts for 3 of 3 hosts ({NO_AGENT}) for vmsched_Memory")


def test_weights_sent_per_unit_rank_hosts_by_the_engines_sum() -> None:
    outcomes = [ScoreOutcome(unit="A", ok=True, factor=3, scores=[(H[0], 1.0), (H[1], 0.0), (H[2], 2.0)]),
                ScoreOutcome(unit="B", ok=True, factor=1, scores=[(H[0], 0.0), (H[1], 4.0), (H[2], 0.0)])]
    record = _score(outcomes, per_unit=True)
    assert len(record["result"]) == 6 and all(len(row) == 3 for row in record["result"])
    assert record["summary"] == f"best {H[0]} (weight 3, lowest) of 3 scored hosts: 2 of 2 units scored"


def test_a_long_failure_is_shortened_by_whole_words_never_cutting_an_id() -> None:
    error = "ValueError: " + "the guest is not placeable here " * 4 + f"because VM {VM} is pinned to {H[0]}"
    assert 120 < error.index(VM) < 160 < error.index(VM) + len(VM)  # today's 160-character cut would split it
    outcomes = [ScoreOutcome(unit="Guests", ok=True, scores=[(H[0], 1.0)]),
                ScoreOutcome(unit="Raises", ok=False, error=error + "\nTraceback ...")]
    summary = _score(outcomes)["summary"]
    failure = re.search(r"Raises failed \((.*)\), ignored$", summary)
    assert failure, summary
    assert failure.group(1).endswith(" ...") and len(failure.group(1)) <= 160
    assert error.startswith(failure.group(1)[:-4]) and "because VM" in failure.group(1)
    assert re.search(r"[0-9a-f]{8}-", failure.group(1)) is None  # the VM's UUID whole or not at all
    many = [FilterOutcome(unit="Memory", ok=True, hosts=[])]
    dropped = _filter(many)["summary"]
    assert dropped == f"kept 0 of 5 hosts: Memory dropped 5 ({H[0]}, {H[1]}, {H[2]} and 2 more)"  # whole IDs


def _filter(outcomes: list[FilterOutcome]) -> dict[str, Any]:
    req = FilterRequest(units=[o.unit for o in outcomes], hosts=H, vm=VM)
    return build("filter", req, filter_decision(H, outcomes), outcomes, bus_failed=False, gateway="gw-a",
                 duration=0.1)
