"""Filters and scores: every unit of a request runs in parallel in the pool."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.messages import (
    Envelope,
    FilterOutcome,
    FilterReply,
    FilterRequest,
    Kind,
    Op,
    ScoreOutcome,
    ScoreReply,
    ScoreRequest,
)
from vmsched.runtime.contract import KIND, BadResult
from vmsched.service import PluginService, UnitRun

_FILTER, _SCORE = KIND[Kind.FILTER], KIND[Kind.SCORE]


class ScoringService(PluginService):
    name = "scoring"
    QUEUES = {REQUEST_QUEUES[Op.FILTER]: "filter", REQUEST_QUEUES[Op.SCORE]: "score"}
    uses_facts = True

    def filter(self, env: Envelope) -> BaseModel:
        req = FilterRequest.model_validate(env.body)
        args = _FILTER.args(req.hosts, req.vm, req.properties)
        runs = self.run_units(Kind.FILTER, req.units, args, env.deadline, req.timeout,
                              lambda: self.facts_for(req.hosts, req.vm))
        return FilterReply(outcomes=[_filter_outcome(run) for run in runs])

    def score(self, env: Envelope) -> BaseModel:
        req = ScoreRequest.model_validate(env.body)
        names = [u.name for u in req.units]
        args = _SCORE.args(req.hosts, req.vm, req.properties)
        runs = self.run_units(Kind.SCORE, names, args, env.deadline, req.timeout,
                              lambda: self.facts_for(req.hosts, req.vm))
        outcomes = [_score_outcome(run, unit.factor) for run, unit in zip(runs, req.units)]
        return ScoreReply(outcomes=outcomes)


def _common(run: UnitRun) -> dict[str, Any]:
    r = run.result
    return {"unit": run.name, "ok": r.ok, "error": r.error, "timed_out": r.timed_out,
            "duration": r.duration, "stderr": r.stderr}


def _filter_outcome(run: UnitRun) -> FilterOutcome:
    outcome = FilterOutcome(**_common(run))
    if run.result.ok:
        try:
            outcome.hosts = _FILTER.check(run.result.value)
        except BadResult as exc:
            outcome.ok, outcome.error = False, str(exc)
    return outcome


def _score_outcome(run: UnitRun, factor: int) -> ScoreOutcome:
    outcome = ScoreOutcome(**_common(run), factor=factor)
    if run.result.ok:
        try:
            outcome.scores = _SCORE.check(run.result.value)
        except BadResult as exc:
            outcome.ok, outcome.error = False, str(exc)
    return outcome
