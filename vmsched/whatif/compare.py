"""Two decisions of one call compared, and each explained per host and unit, as the console shows a decision.

A :class:`Side` is one run of a call's units: their outcomes (the bus models of :mod:`vmsched.messages`) and the
engine's decision made from them with :mod:`vmsched.decide.rules` (:func:`decide`). :func:`compare` says
whether the candidate's decision differs from the baseline's in what the engine would act on:

- filter: the hosts kept;
- score: the best-ranked hosts (the lowest total weight; several when tied). The engine adds its own units and
  its selector may still choose otherwise; :attr:`Comparison.rank` is where the candidate ranks the host the
  baseline ranked first;
- balance: the VM proposed and its destinations.

A unit the candidate lacks (unknown, or its file failed to load) makes the call ``unknown``, never ``changed``.
Pure: nothing here runs a plugin (:mod:`.replay` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vmsched.decide.rules import Decision, balance_decision, filter_decision, score_decision


@dataclass
class Side:
    """One run of a call's units: their outcomes, the decision, the units it lacks."""

    outcomes: list[Any]
    decision: Decision
    unknown: list[str] = field(default_factory=list)

    def unit(self, name: str) -> Any | None:
        return next((o for o in self.outcomes if o.unit == name), None)


def decide(op: str, hosts: list[str], outcomes: list[Any], unknown: list[str] | None = None) -> Side:
    """The engine's decision from the units' outcomes (score weights: one factored total per host)."""
    if op == "filter":
        decision = filter_decision(hosts, outcomes)
    elif op == "score":
        for o in outcomes:  # a unit's aligned numbers, paired with the hosts (as the gateway pairs them)
            values = getattr(o, "values", None)
            if values is not None and len(values) == len(hosts):
                o.scores = list(zip(hosts, values))
        decision = score_decision(hosts, outcomes)
    else:
        decision = balance_decision(hosts, outcomes[0]) if outcomes else Decision(result=["", []])
    return Side(outcomes, decision, list(unknown or []))


def weights(side: Side) -> dict[str, int]:
    """A score decision's weight per host (lower is better)."""
    return {h: w for h, w, *_ in side.decision.result}


def ranks(side: Side) -> dict[str, int]:
    """Each host's rank in a score decision: 1 + the hosts with a lower weight (tied hosts share a rank)."""
    found = weights(side)
    ordered = sorted(found.values())
    first: dict[int, int] = {}
    for i, w in enumerate(ordered):
        first.setdefault(w, i + 1)
    return {h: first[w] for h, w in found.items()}


def best(side: Side) -> list[str]:
    """The best-ranked hosts of a score decision (several when tied), in the engine's order."""
    found = weights(side)
    low = min(found.values(), default=None)
    return [h for h, w in found.items() if w == low]


@dataclass
class Comparison:
    """How the candidate's decision of one call differs from the baseline's."""

    op: str
    status: str  # "same", "changed" or "unknown" (the candidate lacks units: ``unknown``)
    what: str  # one line: what changed, or why unknown
    unknown: list[str] = field(default_factory=list)
    tie: bool = False  # score: the baseline's or the candidate's best rank is shared by several hosts
    rank: int | None = None  # score: the candidate's rank of the host the baseline ranked first (of tied ones, the best)

    @property
    def changed(self) -> bool:
        return self.status == "changed"


def compare(op: str, hosts: list[str], base: Side, cand: Side) -> Comparison:
    lacking = [u for u in cand.unknown if u not in base.unknown]
    if op == "filter":
        comparison = _filters(base, cand)
    elif op == "score":
        comparison = _scores(base, cand)
    else:
        comparison = _balances(base, cand)
    if lacking:
        comparison.status = "unknown"
        comparison.what = f"the candidate lacks {', '.join(lacking)}"
        comparison.unknown = lacking
    return comparison


def _filters(base: Side, cand: Side) -> Comparison:
    kept_b, kept_c = base.decision.result, cand.decision.result
    if set(kept_b) == set(kept_c):
        return Comparison("filter", "same", f"keeps the same {len(kept_c)} hosts")
    more = [h for h in kept_c if h not in kept_b]
    less = [h for h in kept_b if h not in kept_c]
    parts = ([f"also keeps {_few(more)}"] if more else []) + ([f"drops {_few(less)}"] if less else [])
    return Comparison("filter", "changed", f"keeps {len(kept_c)} hosts (baseline {len(kept_b)}): " + "; ".join(parts))


def _scores(base: Side, cand: Side) -> Comparison:
    best_b, best_c = best(base), best(cand)
    tie = len(best_b) > 1 or len(best_c) > 1
    placed = ranks(cand)
    rank = min((placed[h] for h in best_b if h in placed), default=None)
    tied = " (tied)" if tie else ""
    if set(best_b) == set(best_c):
        return Comparison("score", "same", f"ranks {_few(best_c)} first{tied}", tie=tie, rank=rank)
    return Comparison("score", "changed", f"ranks {_few(best_c)} first instead of {_few(best_b)}{tied}; the engine "
                      "adds its own units and its selector may still choose otherwise", tie=tie, rank=rank)


def _balances(base: Side, cand: Side) -> Comparison:
    vm_b, to_b = base.decision.result
    vm_c, to_c = cand.decision.result
    if vm_b == vm_c and set(to_b) == set(to_c):
        return Comparison("balance", "same", f"proposes migrating {vm_c} to {_few(to_c)}" if vm_c else "no migration")
    now = f"migrating {vm_c} to {_few(to_c)}" if vm_c else "no migration"
    then = f"migrating {vm_b} to {_few(to_b)}" if vm_b else "no migration"
    return Comparison("balance", "changed", f"proposes {now} instead of {then}")


def _few(hosts: list[str], shown: int = 3) -> str:
    if not hosts:
        return "none"
    return ", ".join(hosts[:shown]) + (f" and {len(hosts) - shown} more" if len(hosts) > shown else "")


# --- per host and unit, as the console shows a decision ----------------------------------------------------


def explain(op: str, hosts: list[str], side: Side) -> dict[str, dict[str, str]]:
    """Per host, each unit's verdict (kept, dropped, a score, proposed; with the unit's reason) and the result."""
    rows: dict[str, dict[str, str]] = {h: {} for h in hosts}
    placed = ranks(side) if op == "score" else {}
    weighted = weights(side) if op == "score" else {}
    kept = set(side.decision.result) if op == "filter" else set()
    to = set(side.decision.result[1]) if op == "balance" else set()
    for o in side.outcomes:
        for h in hosts:
            rows[h][o.unit] = _cell(op, o, h)
    for h in hosts:
        if op == "filter":
            rows[h]["result"] = "kept" if h in kept else "dropped"
        elif op == "score":
            rows[h]["result"] = f"weight {weighted[h]}, rank {placed[h]}" if h in weighted else ""
        else:
            rows[h]["result"] = "destination" if h in to else ""
    return rows


def _cell(op: str, o: Any, host: str) -> str:
    if o.timed_out:
        return "timed out"
    if not o.ok:
        return "failed"
    why = o.reasons.get(host)
    tail = f": {why}" if why else ""
    if op == "filter":
        return ("kept" if host in o.hosts else "dropped") + tail
    if op == "score":
        found = [s for h, s in o.scores if h == host]
        return (f"score {found[0]:g}" if found else "no score") + (f" x{o.factor}" if o.factor != 1 else "") + tail
    return ("proposed" if host in o.hosts else "") + tail
