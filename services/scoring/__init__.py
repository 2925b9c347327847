"""Scoring service: runs filter and score units (queues vmsched.filter.v2, vmsched.score.v2).

Filters and scores: every unit of a request runs in parallel in the pool.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.messages import Envelope, FilterReply, FilterRequest, Kind, Op, ScoreOutcomeOnBus, ScoreReply, ScoreRequest
from vmsched.facts.pending import PendingBook, attach
from vmsched.runtime.contract import KIND
from vmsched.runtime.units import filter_outcome, score_outcome
from vmsched.service import PluginService, missing_facts

_FILTER, _SCORE = KIND[Kind.FILTER], KIND[Kind.SCORE]


class ScoringService(PluginService):
    name = "scoring"
    QUEUES = {REQUEST_QUEUES[Op.FILTER]: "filter", REQUEST_QUEUES[Op.SCORE]: "score"}
    uses_facts = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool.aligned_scores = True  # a unit that scored every host in order sends its numbers alone
        self.pending = PendingBook()  # VMs ranked first moments ago (vmsched/facts/pending.py)

    def _call_facts(self, hosts: list[str], vm: str) -> Any:
        """The call's facts with the placements still pending elsewhere (the stock memory filter counts them)."""
        found = self.facts_for(hosts, vm)
        return attach(found, lambda: self.pending.view(self.facts, exclude=vm)) if self.facts is not None else found

    def filter(self, env: Envelope) -> BaseModel:
        req = FilterRequest.model_validate(env.body)
        args = _FILTER.args(req.hosts, req.vm, req.properties)
        facts, shadowed = self.call_facts(env, lambda: self._call_facts(req.hosts, req.vm))
        runs = self.run_units(Kind.FILTER, req.units, args, env.deadline, req.timeout, facts)
        outcomes = [filter_outcome(run, req.hosts) for run in runs]
        if shadowed:
            self.shadowed(env, Kind.FILTER, req.hosts, req.vm, req.properties, [(u, 1) for u in req.units], facts,
                          outcomes)
        return FilterReply(outcomes=outcomes, missing_facts=missing_facts(runs, req.hosts, req.vm))

    def score(self, env: Envelope) -> BaseModel:
        req = ScoreRequest.model_validate(env.body)
        names = [u.name for u in req.units]
        args = _SCORE.args(req.hosts, req.vm, req.properties)
        facts, shadowed = self.call_facts(env, lambda: self._call_facts(req.hosts, req.vm))
        runs = self.run_units(Kind.SCORE, names, args, env.deadline, req.timeout, facts)
        outcomes = [score_outcome(run, unit.factor, req.hosts) for run, unit in zip(runs, req.units)]
        if self.facts is not None:
            self.pending.placed(self.facts, req.vm, req.hosts, ((o.factor, _pairs(o, req.hosts)) for o in outcomes
                                                                 if o.ok))  # paired only if the VM's memory is known
        if shadowed:
            self.shadowed(env, Kind.SCORE, req.hosts, req.vm, req.properties,
                          [(u.name, u.factor) for u in req.units], facts, outcomes)
        for o in outcomes:
            _align(o, req.hosts)
        return ScoreReply(outcomes=outcomes, missing_facts=missing_facts(runs, req.hosts, req.vm))


def _pairs(outcome: ScoreOutcomeOnBus, hosts: list[str]) -> list[tuple[str, float]]:
    """The outcome's (host, score) pairs (its aligned numbers paired with the requested hosts)."""
    return outcome.scores if outcome.values is None else list(zip(hosts, outcome.values))


def _align(outcome: ScoreOutcomeOnBus, hosts: list[str]) -> None:
    """Only the numbers, when the unit scored every requested host once and in order (the sender pairs them)."""
    pairs = outcome.scores
    if outcome.values is None and outcome.ok and len(pairs) == len(hosts) and [p[0] for p in pairs] == hosts:
        outcome.values, outcome.scores = [p[1] for p in pairs], []
