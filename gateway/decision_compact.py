"""A decision as the log keeps it until a reader asks: tuples of strings and numbers, made on the request path.

:func:`compact` is cheap (about 2 µs for 3 filters on 100 hosts: no string is copied; a filter unit keeps only
the hosts it dropped, the engine's own strings, as :func:`~vmsched.gateway.render.filter_decision` found them,
and the result, the hosts no working unit dropped, is read back from them) and keeps none of the request's
objects: the request, the units' outcomes and the engine's decision die with the request, as without a
decision log. It writes them into **one flat tuple** of strings, numbers, None and bools: the collector stops tracking such a tuple the
first time a collection sees it. Nested tuples are not so lucky: a collection untracks one level at a time
(its pass over the young objects may meet a parent before its children), so the outer levels survive into
older generations; a score decision's 400 pair tuples and their parents, kept for as long as the ring kept
the decision, reached the old one and set off full collections that walked the whole heap: about 80 µs of
collector CPU per score call, one full collection every 600-700 calls, none without the log
(docs/performance.md, "Decision log cost"). Keeping each decision's request, outcome and decision objects did
the same, about 75 µs per call. :func:`build_compact` reads the flat tuple back (:func:`_read`) into exactly
the record :func:`decisions.build` makes from the objects.

The ring keeps the tuple marshalled into one bytes object (:func:`vmsched.gateway.decision_ring.kept`), so
what matters here is how many cells the tuple has: each is written on the request path and marshalled once.
The engine's hosts are one string (joined by :data:`SEP`, which XML cannot carry; one by one if a host holds
it; when the hosts are those of the last decision, as the engine sends them, its string is reused instead of
joined again), a score unit's aligned scores (one per requested host, in order) one ``bytes`` of doubles,
and the result's weights (:attr:`Decision.weights`, one per requested host) one ``bytes`` of integers: a
score decision on 100 hosts is about 40 cells, not 900.
"""

from __future__ import annotations

import struct
from itertools import chain
from types import SimpleNamespace
from typing import Any

from vmsched.gateway import decisions
from vmsched.gateway.render import Decision

Compact = tuple[Any, ...]
SEP = "\0"  # between the engine's hosts, kept as one string


def compact(op: str, req: Any, decision: Decision, outcomes: Any) -> Compact:
    """What :func:`decisions.build` needs of one decision, as one flat tuple of strings, numbers, None and bools
    (the layout is :func:`_read`'s)."""
    hosts = req.hosts
    # req.unit only on a balance request: getattr(req, "unit", "") on another one makes pydantic raise, 10 us
    out: list[Any] = [op, req.vm if op != "balance" else "", req.unit if op == "balance" else "", len(hosts)]
    joined = _joined(hosts)
    out.append(joined)
    if joined is None:
        out += hosts
    derived = False  # the result is filter_decision's: the requested hosts no working unit dropped
    if isinstance(outcomes, list):
        out.append(len(outcomes))
        if op == "filter":
            derived = decision.dropped is not None and len(decision.dropped) == len(outcomes)
            _filter_units(out, outcomes, decision.dropped if derived else None, hosts)
        else:
            for o in outcomes:
                _unit(out, o)
    elif outcomes is not None:
        out.append(1)
        _unit(out, outcomes)
    else:
        out.append(0)
    if derived:  # read back from the units' dropped hosts: no cell per kept host
        out.append("derived")
    elif decision.weights is not None and len(decision.weights) == len(hosts):  # one per requested host, in order
        try:
            out += ("weights", struct.pack(f"{len(hosts)}q", *decision.weights))
        except struct.error:  # not 64-bit integers: as rows
            _result(out, op, decision.result)
    else:
        _result(out, op, decision.result)
    out.append(len(decision.plugin_errors))
    for unit, texts in decision.plugin_errors.items():
        out += (unit, len(texts), *texts)
    out.append(len(decision.errors))
    out += decision.errors
    return tuple(out)


_last: tuple[list[str] | None, str | None] = (None, None)  # the hosts of the last request, and their string


def _joined(hosts: list[str]) -> str | None:
    """The hosts as one string, or None if a host holds SEP. The engine asks about the same hosts again and again
    (a cluster's): the same hosts as the last request reuse its string (compared, not joined again)."""
    global _last
    last, joined = _last
    if hosts == last:
        return joined
    joined = SEP.join(hosts)
    if joined.count(SEP) != len(hosts) - 1:
        return None
    _last = (list(hosts), joined)
    return joined


def _filter_units(out: list[Any], outcomes: list[Any], dropped: list[set[str] | None] | None,
                  hosts: list[str]) -> None:
    """Filter units keep only the hosts they dropped (the engine's own strings, not the reply's 90 kept ones):
    filter_decision's sets (a failed unit's None: it drops nothing), else worked out here."""
    offered = set(hosts) if dropped is None else None
    for i, o in enumerate(outcomes):
        gone = (dropped[i] or ()) if offered is None else offered.difference(o.hosts)
        _head(out, o)
        out += (True, len(gone), *gone)


def _head(out: list[Any], o: Any) -> None:
    reasons = o.reasons
    out += (o.kind, o.unit, o.ok, o.error, o.timed_out, o.duration, len(reasons))
    if reasons:
        out += chain.from_iterable(reasons.items())


def _unit(out: list[Any], o: Any) -> None:
    """One unit's outcome as cells: a score unit's aligned scores as one bytes object (see the module doc)."""
    _head(out, o)
    if o.kind == "filter":  # a filter unit outside a filter decision (not sent): the hosts it kept
        out += (False, len(o.hosts), *o.hosts)
    elif o.kind == "score":
        values = getattr(o, "values", None)
        if values is not None:  # a score of each requested host, in order (paired_scores): packed doubles
            out += (o.factor, -1, struct.pack(f"{len(values)}d", *values))
        else:  # (host, score) pairs (the model's), as 2n cells
            out += (o.factor, len(o.scores))
            out += chain.from_iterable(o.scores)
    else:
        out += (o.vm, len(o.hosts), *o.hosts, o.reason)


def _result(out: list[Any], op: str, result: Any) -> None:
    if isinstance(result, list):
        if op == "score" and result:
            widths = set(map(len, result))
            if len(widths) == 1:  # [host, weight] (or [host, weight, unit] per unit) rows as cells
                out += ("rows", widths.pop(), len(result))
                out += chain.from_iterable(result)
                return
        elif op == "balance":
            if len(result) == 2:
                out += ("balance", result[0], len(result[1]), *result[1])
                return
        else:  # a filter's hosts, or no scores
            out += ("list", len(result), *result)
            return
    out += ("as is", result)  # rows of mixed widths, anything unexpected


def _read(flat: Compact) -> tuple[Any, ...]:
    """:func:`compact`'s flat tuple back in the nested form :func:`build_compact` reads."""
    engine = hosts(flat)
    at = 5 if flat[4] is not None else 5 + flat[3]
    op, vm, unit = flat[0], flat[1], flat[2]
    units = []
    for _ in range(flat[at]):
        at += 1
        kind, name, ok, error, timed_out, duration, count = flat[at:at + 7]
        at += 7
        reasons = _pairs(flat[at:at + 2 * count], 2)
        at += 2 * count
        head = (kind, name, ok, error, timed_out, duration, reasons)
        if kind == "filter":
            only_dropped, count = flat[at], flat[at + 1]
            units.append(head + (flat[at + 2:at + 2 + count], only_dropped))
            at += 1 + count
        elif kind == "score":
            factor, count = flat[at], flat[at + 1]
            if count == -1:  # packed doubles, one per requested host
                packed = flat[at + 2]
                units.append(head + (factor, tuple(zip(engine, struct.unpack(f"{len(packed) // 8}d", packed)))))
                at += 2
            else:
                units.append(head + (factor, _pairs(flat[at + 2:at + 2 + 2 * count], 2)))
                at += 1 + 2 * count
        else:
            vm_moved, count = flat[at], flat[at + 1]
            units.append(head + (vm_moved, flat[at + 2:at + 2 + count], flat[at + 2 + count]))
            at += 2 + count
    at += 1
    form = flat[at]
    if form == "derived":  # filter_decision's: the requested hosts that no working unit dropped, in order
        gone = set().union(*(u[7] for u in units if u[0] == "filter" and u[2]))
        result = tuple(h for h in engine if h not in gone)
        at += 1
    elif form == "weights":  # packed integers, one per requested host
        packed = flat[at + 1]
        result: Any = tuple(zip(engine, struct.unpack(f"{len(packed) // 8}q", packed)))
        at += 2
    elif form == "rows":
        width, count = flat[at + 1], flat[at + 2]
        result = _pairs(flat[at + 3:at + 3 + width * count], width)
        at += 3 + width * count
    elif form == "balance":
        count = flat[at + 2]
        result = (flat[at + 1], flat[at + 3:at + 3 + count])
        at += 3 + count
    elif form == "list":
        count = flat[at + 1]
        result = flat[at + 2:at + 2 + count]
        at += 2 + count
    else:
        result = flat[at + 1]
        at += 2
    errors = []
    for _ in range(flat[at]):
        name, count = flat[at + 1], flat[at + 2]
        errors.append((name, flat[at + 3:at + 3 + count]))
        at += 2 + count
    count = flat[at + 1]
    return (op, vm, engine, unit, tuple(units), result, tuple(errors), flat[at + 2:at + 2 + count])


def _pairs(cells: tuple[Any, ...], width: int) -> tuple[tuple[Any, ...], ...]:
    return tuple(zip(*[iter(cells)] * width))


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
        o.factor, o.scores = u[7], list(u[8])
    else:
        o.vm, o.hosts, o.reason = u[7], list(u[8]), u[9]
    return o


def build_compact(kept: Compact, **kwargs: Any) -> dict[str, Any]:
    """The record of a decision kept by :func:`compact`; ``kwargs`` as for :func:`decisions.build`."""
    op, vm, hosts, unit, units, result, plugin_errors, errors = _read(kept)
    if op == "filter" and isinstance(result, tuple):
        result = list(result)
    elif op == "score" and isinstance(result, tuple):
        result = [list(pair) for pair in result]
    elif op == "balance" and isinstance(result, tuple):
        result = [result[0], list(result[1])]
    decision = Decision(result=result, plugin_errors={u: list(t) for u, t in plugin_errors}, errors=list(errors))
    outcomes = [_thawed(u, hosts) for u in units]
    req = SimpleNamespace(vm=vm, hosts=list(hosts), unit=unit)
    return decisions.build(op, req, decision, outcomes if op != "balance" else (outcomes[0] if outcomes else None),
                           **kwargs)


def hosts(parts: Compact) -> tuple[str, ...]:
    """The engine's hosts of a kept decision."""
    if parts[4] is None:
        return parts[5:5 + parts[3]]
    return tuple(parts[4].split(SEP)) if parts[3] else ()
