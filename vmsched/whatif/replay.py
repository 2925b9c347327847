"""Replaying recorded calls through a candidate: a plugins folder run as the services run it.

A :class:`Policy` loads a plugins folder in a :class:`~vmsched.runtime.PluginPool` with the services' sandbox
(the caller gives the limits and confinement: ``vmsched.service.plugin_sandbox``) and runs a call's units with
:class:`~vmsched.runtime.units.UnitRunner`, the recorded facts attached as live facts are. A :class:`Change`
says what the candidate changes in every call (factors, units added or dropped). :func:`replay` runs calls on
several threads and yields a :class:`Result` per call: the baseline (the recorded outcome, or a second folder
run side by side, call by call, in turn first) and the candidate, compared (:mod:`.compare`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from vmsched.facts.wire import PreparedFacts
from vmsched.messages import Kind, UnitInfo
from vmsched.runtime.catalog import Catalog
from vmsched.runtime.contract import KIND
from vmsched.runtime.pool.planning import BUNDLE_SECONDS
from vmsched.runtime.pool.pool import PluginPool
from vmsched.runtime.types import Confinement, Limits
from vmsched.runtime.units import UnitRunner, balance_outcome, filter_outcome, score_outcome
from vmsched.whatif.compare import Comparison, Side, compare, decide
from vmsched.whatif.reader import RecordedCall


@dataclass(frozen=True)
class Change:
    """What the candidate changes in every call it replays."""

    factors: dict[str, int] = field(default_factory=dict)  # score unit -> its factor
    add: tuple[tuple[str, str, int], ...] = ()  # (op, unit, factor): run in every call of that op too
    drop: frozenset[str] = frozenset()  # units left out of every call

    def units(self, op: str, live: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The candidate's units of a call of ``op`` whose units were ``live``, with their factors."""
        units = [(n, self.factors.get(n, f)) for n, f in live if n not in self.drop]
        added = [(n, f) for o, n, f in self.add if o == op]
        if op == "balance":  # one balancer a call: an added one runs instead
            return added[-1:] or units
        return units + [(n, f) for n, f in added if all(n != u for u, _ in units)]

    def describe(self) -> list[str]:
        return ([f"{u} factor {f}" for u, f in self.factors.items()] + [f"+ {op} {u}" for op, u, _ in self.add]
                + [f"- {u}" for u in sorted(self.drop)])


class Policy:
    """A plugins folder in a sandboxed pool of ``workers`` processes, as a service loads it: the candidate or the
    baseline of a replay (or of a shadow)."""

    def __init__(self, folder: Path, limits: Limits, confinement: Confinement, workers: int,
                 timeout_for: Callable[[str], float], name: str = "replay",
                 bundle_seconds: float = BUNDLE_SECONDS, also: Sequence[Path] = ()) -> None:
        """``also``: folders whose units the candidate has too, after ``folder``'s (the stock plugins)."""
        self.folder = Path(folder).absolute()
        self.timeout_for = timeout_for
        folders = [self.folder, *(Path(d).absolute() for d in also)]
        self.pool = PluginPool(folders, size=workers, limits=limits, name=name, confinement=confinement,
                               bundle_seconds=bundle_seconds)
        self.pool.aligned_scores = True  # as the scoring service
        self.catalog = Catalog(folders, self.pool, analyze_timeout=timeout_for(""), log_changes=False)
        self.runner = UnitRunner(self.catalog, self.pool, timeout_for)

    def start(self) -> Policy:
        self.pool.start()
        self.catalog.refresh()
        self.pool.warm(sorted({u.plugin for u in self.catalog.units()}))
        return self

    def close(self) -> None:
        self.catalog.stop()
        self.pool.close()

    def units(self) -> list[UnitInfo]:
        return self.catalog.units()

    def run(self, op: str, hosts: list[str], vm: str, properties: dict[str, str], units: list[tuple[str, int]],
            facts: PreparedFacts | None) -> Side:
        """``units`` (names and factors) of a call of ``op`` run on its arguments with ``facts`` (the call's, as a
        service prepares them), and the engine's decision made of their outcomes."""
        kind = Kind(op)
        names = [n for n, _ in units]
        args = KIND[kind].args(hosts, vm, properties)
        deadline = time.time() + max((self.timeout_for(n) for n in names), default=0.0) + 1.0
        runs = self.runner.run(kind, names, args, deadline, None, (lambda: facts) if facts is not None else None)
        if op == "filter":
            outcomes = [filter_outcome(r, hosts) for r in runs]
        elif op == "score":
            outcomes = [score_outcome(r, f, hosts) for r, (_, f) in zip(runs, units)]
        else:
            outcomes = [balance_outcome(r, hosts) for r in runs]
        return decide(op, hosts, outcomes, [r.name for r in runs if r.unknown])


def recorded(call: RecordedCall) -> Side:
    """The baseline a recording gives: the outcomes the services reported then."""
    outcomes = call.outcomes()
    lacking = [o.unit for o in outcomes if not o.ok and _unknown_error(call.op, o.error or "")]
    return decide(call.op, call.hosts, outcomes, lacking)


def _unknown_error(op: str, error: str) -> bool:
    """The error the services give a unit they lack (vmsched.runtime.units.UnitRunner.unknown)."""
    return error.startswith(f"unknown {op} unit ") or ", which failed to load: " in error


@dataclass
class Result:
    call: RecordedCall
    base: Side
    cand: Side
    comparison: Comparison
    side_by_side: bool  # the baseline ran in this replay too: its durations compare with the candidate's


def replay(calls: Iterable[RecordedCall], candidate: Policy, change: Change = Change(),
           baseline: Policy | None = None, threads: int = 2) -> Iterator[Result]:
    """Each call through the candidate (and the baseline policy), in the calls' order, ``threads`` at a time."""

    def run(policy: Policy, call: RecordedCall, units: list[tuple[str, int]]) -> Side:
        return policy.run(call.op, call.hosts, call.vm, call.properties, units, call.facts)

    def one(item: tuple[int, RecordedCall]) -> Result:
        i, call = item
        units = change.units(call.op, call.units)
        if baseline is None:
            base, cand = recorded(call), run(candidate, call, units)
        elif i % 2:  # side by side: each in turn first, so that neither always runs on a warmer machine
            cand = run(candidate, call, units)
            base = run(baseline, call, call.units)
        else:
            base = run(baseline, call, call.units)
            cand = run(candidate, call, units)
        return Result(call, base, cand, compare(call.op, call.hosts, base, cand), baseline is not None)

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="replay") as pool:
        yield from pool.map(one, enumerate(calls))
