"""Turning a service's full outcome into the engine's decision.

Pure functions, shared by the XML-RPC adapter (which sends only ``result``,
``plugin_errors`` and ``errors``) and the JSON API (which shows everything).
The rules are the table "What the old daemon did, and what we do" of the
engine protocol: intersection in input order, foreign IDs dropped and
reported, scores for every requested host as bounded integers in the exact
order of the real totals (:mod:`vmsched.decide.weights`), balance always
``[vm or "", [hosts]]``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import add, mul
from typing import Any

from vmsched.decide.weights import common_denominator, encode, fill_worst, finite, scaled
from vmsched.messages import INT32_MAX, INT32_MIN, BalanceOutcome, DiscoverReply, FilterOutcome, Kind, MissingFacts
from vmsched.messages import ScoreOutcome
from vmsched.words import counted

DISCOVER_KEYS = {Kind.FILTER: "filters", Kind.SCORE: "scores", Kind.BALANCE: "balance"}
ALL_FILTERS_FAILED = "all filters failed"


@dataclass(frozen=True)
class RenderOptions:
    """Gateway settings that shape the engine's reply."""

    score_per_unit: bool = False  # [host, weight, unit] triples, factored by the engine (--score-per-unit)


@dataclass
class Decision:
    result: Any
    plugin_errors: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: score_decision's weights, one per requested host in their order, when ``result`` is exactly those hosts
    #: with them (``[[host, weight], ...]``): what the decision log keeps (not sent; not compared)
    weights: list[int] | None = field(default=None, compare=False, repr=False)
    #: filter_decision's hosts each unit dropped (None for a failed unit), one per outcome, when ``result`` is
    #: exactly the requested hosts that no working unit dropped, in order: what the decision log keeps instead of
    #: the result (not sent; not compared)
    dropped: list[set[str] | None] | None = field(default=None, compare=False, repr=False)
    #: what the units that read host facts lacked (the service's ``missing_facts``): the JSON API and the decision
    #: log show it; never sent to the engine (not in :meth:`envelope`)
    missing_facts: MissingFacts | None = field(default=None, compare=False, repr=False)

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
    return round(min(max(value, INT32_MIN), INT32_MAX))


def _foreign(unit: str, ids: list[str], decision: Decision) -> None:
    """Counted, with short escaped excerpts: what a plugin returns is never echoed verbatim."""
    if ids:
        shown = ", ".join(_excerpt(i) for i in ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        decision.report(unit, f"returned {counted(len(ids), 'host ID')} not in the request, dropped: {shown}")


def _excerpt(value: object, size: int = 16) -> str:
    text = str(value)
    return ascii(text[:size]) + ("..." if len(text) > size else "")


def filter_decision(hosts: list[str], outcomes: list[FilterOutcome]) -> Decision:
    decision = Decision(result=list(hosts))
    requested = set(hosts)
    dropped: list[set[str] | None] = []
    for o in outcomes:
        if not o.ok:
            decision.report(o.unit, o.error or "failed")
            dropped.append(None)
            continue
        gone = requested.difference(o.hosts)
        if len(o.hosts) != len(requested) - len(gone):  # not each a requested host once: a foreign one, or twice
            _foreign(o.unit, [h for h in o.hosts if h not in requested], decision)
        dropped.append(gone)
    decision.dropped = dropped
    working = [gone for gone in dropped if gone is not None]
    if outcomes and not working:
        decision.errors.append(ALL_FILTERS_FAILED)
        return decision
    gone = set().union(*working)  # kept by every working unit: the requested hosts none of them dropped
    if gone:
        decision.result = [h for h in hosts if h not in gone]
    return decision


def _requested_scores(hosts: dict[str, None], o: ScoreOutcome,
                      decision: Decision) -> tuple[dict[str, float], dict[str, list[float]]]:
    """A working unit's finite scores of requested hosts: one per host, and every score of a host it scored
    more than once (rare); foreign IDs and non-finite scores reported."""
    single = {host: float(score) for host, score in o.scores}
    total = sum(single.values())
    if len(single) == len(o.scores) and total - total == 0.0 and hosts.keys() >= single.keys():
        return single, {}  # the common case in one pass: each host once, all requested, all finite
    single = {}
    repeated: dict[str, list[float]] = {}
    foreign, broken = [], []
    for host, score in o.scores:
        if host not in hosts:
            foreign.append(host)
        elif not (score - score == 0.0 if type(score) is float else finite(score)):  # inf - inf and NaN: NaN
            broken.append(host)
        elif host in single:
            repeated.setdefault(host, [single[host]]).append(float(score))
        else:
            single[host] = float(score)
    _foreign(o.unit, foreign, decision)
    if broken:
        decision.report(o.unit, f"gave {counted(len(broken), 'host')} a score that is not a finite number "
                                f"(first {_excerpt(broken[0])}); they get the unit's worst score")
        for host in broken:
            single.pop(host, None)
            repeated.pop(host, None)
    return single, repeated


def _exact_terms(values: list[float], factor: int, den: int) -> list[int]:
    """Each value times ``factor`` and ``den``, exactly."""
    if factor > 0 and factor & (factor - 1) == 0:  # a power of two, like den: one exact float product per value
        return _exact_values(values, den * factor)
    return list(map(mul, repeat(factor), _exact_values(values, den)))


def _exact_values(values: list[float], den: int) -> list[int]:
    """Each value times ``den``, exactly."""
    # den is a power of two (floats are dyadic): v * den is exact in floating point unless it overflows
    factor = float(den) if den < 2**1000 else 0.0
    if factor and max(map(abs, values), default=0.0) * factor < 1e300:
        return list(map(int, map(mul, values, repeat(factor))))
    return [scaled(v, den) for v in values]


def _exact(single: dict[str, float], repeated: dict[str, list[float]], den: int) -> dict[str, int]:
    """Each host's score (the sum of its scores) times ``den``, exactly."""
    exact = dict(zip(single, _exact_values(list(single.values()), den)))
    for h, vs in repeated.items():
        exact[h] = sum(scaled(v, den) for v in vs)
    return exact


def _unit_table(hosts: dict[str, None], outcomes: list[ScoreOutcome],
                decision: Decision) -> tuple[list[tuple[ScoreOutcome, dict[str, int]]], int]:
    """Per working unit, every requested host's score times one common denominator (exact), and it."""
    found = []
    for o in outcomes:
        if o.ok:
            found.append((o, *_requested_scores(hosts, o, decision)))
        else:
            decision.report(o.unit, o.error or "failed")
    values: set[float] = set()
    for _, single, repeated in found:
        values.update(single.values())
        for vs in repeated.values():
            values.update(vs)
    den = common_denominator(values)
    order = list(hosts)
    table = [(o, fill_worst(order, _exact(single, repeated, den), o.factor)) for o, single, repeated in found]
    return table, den


def score_decision(hosts: list[str], outcomes: list[ScoreOutcome], per_unit: bool = False) -> Decision:
    """``[[host, weight], ...]`` for every requested host (see :mod:`vmsched.decide.weights`).

    A host a unit did not score gets that unit's worst score. With ``per_unit``
    the reply is ``[[host, weight, unit], ...]`` per working unit, each unit
    encoded on its own and NOT factored: the engine multiplies by the unit's
    factor itself. With no working unit, every host gets 0.
    """
    decision = Decision(result=[])
    requested = dict.fromkeys(hosts)
    if not per_unit and len(requested) == len(hosts):
        aligned = _aligned(len(hosts), outcomes)
        if aligned is not None:
            return _aligned_decision(hosts, outcomes, aligned, decision)
    table, den = _unit_table(requested, outcomes, decision)
    if per_unit and table:
        for o, weights in table:
            decision.result += [[h, w, o.unit] for h, w in zip(weights, encode(list(weights.values()), den))]
        return decision
    totals = [0] * len(requested)
    for o, weights in table:  # each unit's weights are keyed by the requested hosts, in their order
        totals = list(map(add, totals, map(mul, repeat(o.factor), weights.values())))
    weights = encode(totals, den)
    decision.result = list(map(list, zip(requested, weights)))
    if len(requested) == len(hosts):  # no host asked twice: the rows are the requested hosts, in order
        decision.weights = weights
    return decision


def _aligned(count: int, outcomes: list[ScoreOutcome]) -> list[tuple[ScoreOutcome, list[float]]] | None:
    """Each working unit's score of every requested host, in order (the aligned values that paired_scores leaves
    beside a unit's pairs), when every working unit has them and they are all finite; else None."""
    found = []
    for o in outcomes:
        if o.ok:
            values = getattr(o, "values", None)
            if values is None or len(values) != count:
                return None
            values = list(map(float, values))
            total = sum(values)
            if total - total != 0.0:  # an infinite or NaN score (or a sum past the floats): the general path
                return None
            found.append((o, values))
    return found


def _aligned_decision(hosts: list[str], outcomes: list[ScoreOutcome], aligned: list[tuple[ScoreOutcome, list[float]]],
                      decision: Decision) -> Decision:
    """score_decision's weights from aligned values: the same as from the pairs, without a dict per unit (no host
    asked twice; every working unit scored every host once, with a finite number: nothing foreign, nothing
    filled in)."""
    for o in outcomes:
        if not o.ok:
            decision.report(o.unit, o.error or "failed")
    den = common_denominator(chain.from_iterable(values for _, values in aligned))
    totals: list[int] | None = None
    for o, values in aligned:
        if o.factor:  # a factor of 0 adds nothing
            terms = _exact_terms(values, o.factor, den)
            totals = terms if totals is None else list(map(add, totals, terms))
    weights = encode([0] * len(hosts) if totals is None else totals, den)
    decision.result = list(map(list, zip(hosts, weights)))
    decision.weights = weights
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
