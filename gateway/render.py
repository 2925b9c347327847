"""Turning a service's full outcome into the engine's decision.

Pure functions, shared by the XML-RPC adapter (which sends only ``result``,
``plugin_errors`` and ``errors``) and the JSON API (which shows everything).
The rules are the table "What the old daemon did, and what we do" of the
engine protocol: intersection in input order, foreign IDs dropped and
reported, scores factored, rounded and clamped to int32, balance always
``[vm or "", [hosts]]``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from vmsched.messages import BalanceOutcome, DiscoverReply, FilterOutcome, Kind, ScoreOutcome

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
DISCOVER_KEYS = {Kind.FILTER: "filters", Kind.SCORE: "scores", Kind.BALANCE: "balance"}
ALL_FILTERS_FAILED = "all filters failed"


@dataclass
class Decision:
    result: Any
    plugin_errors: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def result_code(self) -> int:
        return 1 if self.plugin_errors or self.errors else 0

    def report(self, unit: str, message: str) -> None:
        self.plugin_errors.setdefault(unit, []).append(message)

    def envelope(self) -> dict[str, Any]:
        return {"result_code": self.result_code, "result": self.result,
                "plugin_errors": self.plugin_errors, "errors": self.errors}


def clamp_int32(value: float) -> int:
    if value != value:  # NaN
        return 0
    if value >= INT32_MAX:
        return INT32_MAX
    if value <= INT32_MIN:
        return INT32_MIN
    return int(round(value))


def _foreign(unit: str, ids: list[str], decision: Decision) -> None:
    """Counted, with short escaped excerpts: what a plugin returns is never echoed verbatim (issue 9)."""
    if ids:
        shown = ", ".join(_excerpt(i) for i in ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        decision.report(unit, f"returned {len(ids)} host ID(s) not in the request, dropped: {shown}")


def _excerpt(value: object, size: int = 16) -> str:
    text = str(value)
    return ascii(text[:size]) + ("..." if len(text) > size else "")


def filter_decision(hosts: list[str], outcomes: list[FilterOutcome]) -> Decision:
    decision = Decision(result=list(hosts))
    requested = set(hosts)
    kept: list[set[str]] = []
    for o in outcomes:
        if not o.ok:
            decision.report(o.unit, o.error or "failed")
            continue
        _foreign(o.unit, [h for h in o.hosts if h not in requested], decision)
        kept.append(set(o.hosts))
    if outcomes and not kept:
        decision.errors.append(ALL_FILTERS_FAILED)
        return decision
    common = set.intersection(*kept)
    decision.result = [h for h in hosts if h in common]
    return decision


def score_totals(hosts: list[str], outcomes: list[ScoreOutcome], decision: Decision) -> dict[str, float]:
    requested = set(hosts)
    totals: dict[str, float] = {}
    for o in outcomes:
        if not o.ok:
            decision.report(o.unit, o.error or "failed")
            continue
        factor, foreign = o.factor, []
        for host, score in o.scores:
            if host in requested:
                totals[host] = totals.get(host, 0.0) + factor * score
            else:
                foreign.append(host)
        _foreign(o.unit, foreign, decision)
    return totals


def score_decision(hosts: list[str], outcomes: list[ScoreOutcome]) -> Decision:
    decision = Decision(result=[])
    totals = score_totals(hosts, outcomes, decision)
    decision.result = [[h, clamp_int32(totals[h])] for h in dict.fromkeys(hosts) if h in totals]
    return decision


def balance_decision(hosts: list[str], outcome: BalanceOutcome) -> Decision:
    decision = Decision(result=["", []])
    if not outcome.ok:
        decision.report(outcome.unit, outcome.error or "failed")
        return decision
    if outcome.vm and not _is_uuid(outcome.vm):
        decision.report(outcome.unit, f"proposed VM {outcome.vm!r:.60} is not a UUID; no migration")
        return decision
    requested = set(hosts)
    _foreign(outcome.unit, [h for h in outcome.hosts if h not in requested], decision)
    decision.result = [outcome.vm, [h for h in outcome.hosts if h in requested]]
    return decision


def discover_result(reply: DiscoverReply) -> dict[str, dict[str, list[str]]]:
    """The engine's discover struct: exactly three keys, units with valid validation only."""
    out: dict[str, dict[str, list[str]]] = {key: {} for key in DISCOVER_KEYS.values()}
    for unit in reply.units:
        if unit.validation_error is None:
            out[DISCOVER_KEYS[unit.kind]][unit.name] = [unit.description, unit.validation]
    return out


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
