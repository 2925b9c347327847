"""A replay's figures: decisions changed per operation, the changed calls explained, per-unit errors, timeouts
and durations; as one JSON-able dict (:meth:`Report.data`), which the terminal summary and the HTML report read.

Property values never enter a report (a properties map may hold credentials): a call shows its property keys.
Durations of a side count only when that side ran in this replay (``measured``): durations recorded under live
load are never compared with a replay's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vmsched.whatif.compare import explain
from vmsched.whatif.replay import Result

OPS = ("filter", "score", "balance")
#: what a change is, per operation
CHANGE = {"filter": "a filter keeps other hosts", "score": "other best-ranked hosts",
          "balance": "another move proposed"}


@dataclass
class UnitFigures:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    unknown: int = 0
    durations: list[float] = field(default_factory=list)

    def add(self, outcome: Any, unknown: bool, measured: bool) -> None:
        self.calls += 1
        if unknown:
            self.unknown += 1
        elif outcome.timed_out:
            self.timeouts += 1
        elif not outcome.ok:
            self.errors += 1
        if measured and not unknown:
            self.durations.append(outcome.duration)

    def data(self) -> dict[str, Any]:
        return {"calls": self.calls, "errors": self.errors, "timeouts": self.timeouts, "unknown": self.unknown,
                "p50": percentile(self.durations, 0.50), "p99": percentile(self.durations, 0.99)}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class Report:
    def __init__(self, candidate: str, baseline: str, change: list[str], side_by_side: bool) -> None:
        self.candidate = candidate
        self.baseline = baseline  # "the recorded outcomes" or a folder
        self.change = change
        self.side_by_side = side_by_side
        self.ops = {op: Counter() for op in OPS}  # type: ignore[var-annotated]
        self.changes: list[dict[str, Any]] = []  # changed and unknown calls, explained
        self.units: dict[str, dict[str, UnitFigures]] = {}
        self.ranks: Counter[int] = Counter()  # score calls: the candidate's rank of the baseline's best host
        self.first = self.last = None  # type: float | None
        self.skipped: dict[str, int] = {}
        self.notes: list[str] = []
        self.files = 0

    def add(self, r: Result) -> None:
        call, c = r.call, r.comparison
        counts = self.ops[call.op]
        counts["calls"] += 1
        counts[c.status] += 1
        counts["ties"] += c.tie
        self.first = call.time if self.first is None else min(self.first, call.time)
        self.last = call.time if self.last is None else max(self.last, call.time)
        if c.rank is not None:
            self.ranks[c.rank] += 1
        for side, found, measured in (("baseline", r.base, r.side_by_side), ("candidate", r.cand, True)):
            for o in found.outcomes:
                figures = self.units.setdefault(o.unit, {"baseline": UnitFigures(), "candidate": UnitFigures()})
                figures[side].add(o, o.unit in found.unknown, measured)
        if c.status != "same":
            hosts = call.hosts
            self.changes.append({
                "id": call.id, "time": call.time, "gateway": call.call.gateway, "op": call.op, "vm": call.vm,
                "status": c.status, "what": c.what, "tie": c.tie, "rank": c.rank, "unknown": c.unknown,
                "units": [n for n, _ in call.units], "properties": sorted(call.properties),
                "omitted": list(call.call.omitted), "hosts": len(hosts),
                "baseline": explain(call.op, hosts, r.base), "candidate": explain(call.op, hosts, r.cand)})

    @property
    def calls(self) -> int:
        return sum(c["calls"] for c in self.ops.values())

    @property
    def changed(self) -> int:
        return sum(c["changed"] for c in self.ops.values())

    def data(self) -> dict[str, Any]:
        """The whole report, JSON-able (``vmsched replay --json``)."""
        return {
            "candidate": self.candidate, "baseline": self.baseline, "change": self.change,
            "side_by_side": self.side_by_side, "files": self.files, "first": self.first, "last": self.last,
            "calls": self.calls, "changed": self.changed,
            "unknown": sum(c["unknown"] for c in self.ops.values()),
            "ops": {op: {"calls": c["calls"], "changed": c["changed"], "unknown": c["unknown"], "ties": c["ties"],
                         "change": CHANGE[op]} for op, c in self.ops.items()},
            "ranks": {str(rank): n for rank, n in sorted(self.ranks.items())},
            "units": {name: {side: f.data() for side, f in sides.items()} for name, sides in sorted(self.units.items())},
            "changes": self.changes, "skipped": self.skipped, "notes": self.notes,
        }
