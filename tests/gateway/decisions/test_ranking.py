"""A score decision read back from its record: places, each unit's part, idle units, the deciding unit."""

from __future__ import annotations

from typing import Any

from tests.support.decisions import build
from vmsched.decide.rules import score_decision
from vmsched.gateway.decisions import ranking
from vmsched.messages import ScoreOutcome, ScoreRequest

H = [f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(4)]


def _record(outcomes: list[ScoreOutcome]) -> dict[str, Any]:
    req = ScoreRequest.model_validate({"units": [{"name": o.unit, "factor": o.factor} for o in outcomes],
                                       "hosts": H, "vm": H[0]})
    return build("score", req, score_decision(H, outcomes), outcomes, bus_failed=False, gateway="gw", duration=0.1)


def test_parts_add_up_in_the_order_of_the_weights_sent() -> None:
    outcomes = [ScoreOutcome(unit="A", ok=True, factor=2, scores=[(H[0], 1.5), (H[1], float("inf")), (H[2], 0.5)]),
                ScoreOutcome(unit="B", ok=True, factor=-1, scores=[(H[0], 1.0), (H[1], 2.0), (H[2], 2.0),
                                                                   (H[3], 1.0)])]
    record = _record(outcomes)
    parts = ranking.parts(record)
    # A did not score H3 and gave H1 no number: both count as its worst, 1.5 (x2)
    assert parts["A"] == {H[0]: 3.0, H[1]: 3.0, H[2]: 1.0, H[3]: 3.0}
    assert parts["B"] == {H[0]: -1.0, H[1]: -2.0, H[2]: -2.0, H[3]: -1.0}
    places = ranking.places(record)
    totals = [sum(p[h.host] for p in parts.values()) for h in places]
    assert totals == sorted(totals) == [-1.0, 1.0, 2.0, 2.0]
    assert [(p.host, p.rank, p.tied) for p in places] == [(H[2], 1, 0), (H[1], 2, 0), (H[0], 3, 1), (H[3], 3, 1)]
    lead = ranking.lead(places, parts)
    assert lead is not None and (lead.unit, lead.best.host, lead.next.host, lead.by) == ("A", H[2], H[1], 2.0)


def test_no_deciding_unit_when_every_host_ties() -> None:
    record = _record([ScoreOutcome(unit="Idle", ok=True, scores=[])])
    places = ranking.places(record)
    assert {p.rank for p in places} == {1} and all(p.tied == 3 for p in places)
    assert ranking.lead(places, ranking.parts(record)) is None
    assert ranking.idle(record) == {"Idle": "no scores returned"}
