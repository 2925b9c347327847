"""Filters and scores: every unit of a request runs in parallel in the pool."""

from __future__ import annotations


from pydantic import BaseModel

from vmsched.services.scoring.results import BadResult, host_list, score_pairs
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.bus.worker import Handler
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
from vmsched.service import PluginService, UnitRun


class ScoringService(PluginService):
    name = "scoring"

    def routes(self) -> dict[str, Handler]:
        return {REQUEST_QUEUES[Op.FILTER]: self.filter, REQUEST_QUEUES[Op.SCORE]: self.score}

    def filter(self, env: Envelope) -> BaseModel:
        req = FilterRequest.model_validate(env.body)
        runs = self.run_units(Kind.FILTER, req.units, (req.hosts, req.vm, req.properties), env.deadline, req.timeout)
        return FilterReply(outcomes=[_filter_outcome(run) for run in runs])

    def score(self, env: Envelope) -> BaseModel:
        req = ScoreRequest.model_validate(env.body)
        names = [u.name for u in req.units]
        runs = self.run_units(Kind.SCORE, names, (req.hosts, req.vm, req.properties), env.deadline, req.timeout)
        outcomes = [_score_outcome(run, unit.factor) for run, unit in zip(runs, req.units)]
        return ScoreReply(outcomes=outcomes)


def _common(run: UnitRun) -> BaseModel:
    r = run.result
    return {"unit": run.name, "ok": r.ok, "error": r.error, "timed_out": r.timed_out,
            "duration": r.duration, "stderr": r.stderr}


def _filter_outcome(run: UnitRun) -> FilterOutcome:
    outcome = FilterOutcome(**_common(run))
    if run.result.ok:
        try:
            outcome.hosts = host_list(run.result.value, "filter")
        except BadResult as exc:
            outcome.ok, outcome.error = False, str(exc)
    return outcome


def _score_outcome(run: UnitRun, factor: int) -> ScoreOutcome:
    outcome = ScoreOutcome(**_common(run), factor=factor)
    if run.result.ok:
        try:
            outcome.scores = score_pairs(run.result.value)
        except BadResult as exc:
            outcome.ok, outcome.error = False, str(exc)
    return outcome
