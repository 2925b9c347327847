"""Aligned score replies: a unit that scored every requested host in order sends its numbers alone; the same
decision as its pairs."""

from __future__ import annotations

import time
from typing import Any

from vmsched.bus.replies import _ok
from vmsched.gateway.engine.operations import SCORE, paired_scores
from vmsched.messages import Envelope, Kind, ScoreOutcomeOnBus, ScoreReply, ScoreRequest, TypedReply
from vmsched.runtime.types import CallResult
from vmsched.service import UnitRun
from vmsched.services.scoring import ScoringService

HOSTS = [f"h{i}" for i in range(5)]


class _Stub:
    facts = None
    pending = None

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def _call_facts(self, hosts: list[str], vm: str) -> None:
        return None

    def call_facts(self, env: Envelope, facts: Any) -> tuple[Any, bool]:
        return facts, False  # neither recorded nor shadowed

    def run_units(self, kind: Kind, names: list[str], *args: Any, **kwargs: Any) -> list[UnitRun]:
        return [UnitRun(n, CallResult(ok=True, value=self.values[n], duration=0.001)) for n in names]


VALUES = {
    "all": [[h, i * 1.5] for i, h in enumerate(HOSTS)],  # every host once, in order: aligned
    "some": [[HOSTS[1], 2], [HOSTS[0], 1]],  # a subset, out of order: pairs
    "twice": [[h, 1] for h in HOSTS[:4]] + [[HOSTS[0], 3]],  # as many pairs as hosts, one host twice: pairs
}


def _score() -> bytes:
    req = ScoreRequest.model_validate({"units": [{"name": n, "factor": 2} for n in VALUES], "hosts": HOSTS})
    env = Envelope(op="score", deadline=time.time() + 30, body=req.model_dump())
    return _ok(ScoringService.score(_Stub(VALUES), env))  # type: ignore[arg-type]


def _pairs() -> ScoreReply:
    """The same reply with every unit's (host, score) pairs, as a unit returns them."""
    return ScoreReply(outcomes=[ScoreOutcomeOnBus(unit=n, ok=True, factor=2, duration=0.001,
                                                  scores=[(h, float(s)) for h, s in VALUES[n]]) for n in VALUES])


def _request() -> ScoreRequest:
    return ScoreRequest.model_validate({"units": [{"name": n, "factor": 2} for n in VALUES], "hosts": HOSTS})


def test_the_service_aligns_only_exact_units() -> None:
    aligned = TypedReply[ScoreReply].model_validate_json(_score()).body
    assert aligned is not None
    by_unit = {o.unit: o for o in aligned.outcomes}
    assert by_unit["all"].values == [i * 1.5 for i in range(5)] and by_unit["all"].scores == []
    assert by_unit["some"].values is None and by_unit["some"].scores == [(HOSTS[1], 2.0), (HOSTS[0], 1.0)]
    assert by_unit["twice"].values is None and len(by_unit["twice"].scores) == 5
    assert len(_score()) < len(_ok(_pairs()))


def test_the_gateway_pairs_aligned_values_into_the_same_outcomes_and_decision() -> None:
    req = _request()
    aligned = TypedReply[ScoreReply].model_validate_json(_score()).body
    plain, aligned = SCORE.complete(req, _pairs()), SCORE.complete(req, aligned)
    assert ([o.model_dump(exclude={"values", "duration"}) for o in aligned.outcomes]
            == [o.model_dump(exclude={"values", "duration"}) for o in plain.outcomes])
    for o in aligned.outcomes:  # the values stay beside the pairs (the decision log keeps them), the same numbers
        assert o.values is None or o.values == [score for _, score in o.scores]
    assert any(o.values is not None for o in aligned.outcomes)
    assert SCORE.decide(req, aligned, _Opts()).result == SCORE.decide(req, plain, _Opts()).result


class _Opts:
    score_per_unit = False


def test_aligned_values_of_another_length_fail_that_unit() -> None:
    reply = TypedReply[ScoreReply].model_validate_json(_score()).body
    assert reply is not None
    shorter = ScoreRequest.model_validate({"units": [{"name": "all"}], "hosts": HOSTS[:3]})
    out = {o.unit: o for o in paired_scores(shorter, reply).outcomes}
    assert not out["all"].ok and "5 aligned scores for 3 hosts" in (out["all"].error or "")
    assert out["all"].scores == [] and out["all"].values is None
    assert out["some"].ok
