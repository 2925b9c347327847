"""A decision as the log keeps it until a reader asks: tuples of strings and numbers, made on the request path.

:func:`compact` is cheap (about 6 µs for 3 filters on 100 hosts: no string is copied; a filter keeps only
the hosts it dropped, the engine's own strings) and keeps none of the request's objects: the request, the
units' outcomes and the engine's decision die with the request, as without a decision log. It also keeps
few objects the collector tracks: a score's pairs are kept as columns (one tuple of hosts, one of scores),
not as one tuple per pair. The collector stops tracking a tuple of atoms only when a collection of its
generation sees it, and a request that frees what it made starts hardly any: 400 pair tuples per score
decision, 80,000 in a ring of 200, stayed tracked in the young generation until a collection walked them
and moved them to the old one, whose full collections then walked the whole heap (about 0.1 ms of collector
CPU per score call on RabbitMQ, against none without the log; docs/performance.md, "Decision log cost").
Keeping each decision's request, outcome and decision objects did the same, about 75 µs per call.
:func:`build_compact` turns the tuples back into exactly the record :func:`decisions.build` makes from the
objects.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vmsched.gateway import decisions
from vmsched.gateway.render import Decision

Compact = tuple[Any, ...]


def compact(op: str, req: Any, decision: Decision, outcomes: Any) -> Compact:
    """What :func:`decisions.build` needs of one decision."""
    if isinstance(outcomes, list):
        offered = set(req.hosts) if op == "filter" else None
        units = tuple(_unit(o, offered) for o in outcomes)
    else:
        units = (_unit(outcomes, None),) if outcomes is not None else ()
    result = decision.result
    if op == "filter" and isinstance(result, list):
        frozen: Any = tuple(result)
    elif op == "score" and isinstance(result, list):
        frozen = _columns(result)
    elif op == "balance" and isinstance(result, list) and len(result) == 2:
        frozen = (result[0], tuple(result[1]))
    else:
        frozen = result
    errors = tuple((unit, tuple(texts)) for unit, texts in decision.plugin_errors.items())
    unit = req.unit if op == "balance" else ""  # getattr(req, "unit", "") on another request: pydantic raises, 10 us
    return (op, req.vm if op != "balance" else "", tuple(req.hosts), unit, units, frozen, errors, tuple(decision.errors))


def _unit(o: Any, offered: set[str] | None) -> tuple[Any, ...]:
    reasons = tuple(o.reasons.items()) if o.reasons else ()
    head = (o.kind, o.unit, o.ok, o.error, o.timed_out, o.duration, reasons)
    if o.kind == "filter":  # only the hosts it dropped: the engine's own strings, not the reply's 90 kept ones
        return head + ((tuple(offered.difference(o.hosts)), True) if offered is not None else (tuple(o.hosts), False))
    if o.kind == "score":
        return head + (o.factor, _columns(o.scores))
    return head + (o.vm, tuple(o.hosts), o.reason)


def _thawed(u: tuple[Any, ...], hosts: tuple[str, ...]) -> SimpleNamespace:
    kind, unit, ok, error, timed_out, duration, reasons = u[:7]
    o = SimpleNamespace(kind=kind, unit=unit, ok=ok, error=error, timed_out=timed_out, duration=duration,
                        reasons=dict(reasons))
    if kind == "filter":
        dropped, only_dropped = u[7], u[8]
        if only_dropped:  # what build needs of the hosts it kept: those it did not drop
            gone = set(dropped)
            o.hosts = [h for h in hosts if h not in gone]
        else:
            o.hosts = list(dropped)
    elif kind == "score":
        o.factor, o.scores = u[7], _rows(u[8], tuple)
    else:
        o.vm, o.hosts, o.reason = u[7], list(u[8]), u[9]
    return o


def build_compact(parts: Compact, **kwargs: Any) -> dict[str, Any]:
    """The record of a decision kept by :func:`compact`; ``kwargs`` as for :func:`decisions.build`."""
    op, vm, hosts, unit, units, result, plugin_errors, errors = parts
    if op == "filter" and isinstance(result, tuple):
        result = list(result)
    elif op == "score" and isinstance(result, tuple):
        result = _rows(result, list)
    elif op == "balance" and isinstance(result, tuple):
        result = [result[0], list(result[1])]
    decision = Decision(result=result, plugin_errors={u: list(t) for u, t in plugin_errors}, errors=list(errors))
    outcomes = [_thawed(u, hosts) for u in units]
    req = SimpleNamespace(vm=vm, hosts=list(hosts), unit=unit)
    return decisions.build(op, req, decision, outcomes if op != "balance" else (outcomes[0] if outcomes else None),
                           **kwargs)


def _columns(rows: Any) -> tuple[Any, ...]:
    """Rows of one length (pairs) as ("columns", one tuple per column): a few tuples instead of one per row;
    rows of mixed lengths as ("rows", the rows as tuples)."""
    if rows and rows[0]:
        try:
            return ("columns", tuple(zip(*rows, strict=True)))  # 2 µs for 100 pairs
        except ValueError:  # rows of mixed lengths
            pass
    return ("rows", tuple(map(tuple, rows)))


def _rows(kept: tuple[Any, ...], row: type) -> list[Any]:
    """The rows that :func:`_columns` kept, each a ``row`` (tuple or list)."""
    form, data = kept
    return [row(r) for r in (zip(*data) if form == "columns" else data)]


def hosts(parts: Compact) -> tuple[str, ...]:
    """The engine's hosts of a kept decision."""
    return parts[2]
