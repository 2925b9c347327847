"""Running the units of one request in a plugin pool, and reading what each returned, as the services do.

:class:`UnitRunner` is what a service (vmsched.service) and a replay (vmsched.whatif) share: it looks each unit up
in the catalog, runs them in parallel in the pool under their timeouts, with the call's host facts for the
plugins that read them. :func:`filter_outcome`, :func:`score_outcome` and :func:`balance_outcome` check what a
unit returned against the contract and give its outcome (the bus models of :mod:`vmsched.messages`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from vmsched.messages import BalanceOutcome, FilterOutcome, Kind, ScoreOutcomeOnBus
from vmsched.runtime.catalog import Catalog
from vmsched.runtime.contract import KIND, BadResult, checked_aligned
from vmsched.runtime.pool.pool import PluginPool
from vmsched.runtime.types import Call, CallResult

#: Time kept back from the caller's deadline to send the reply.
REPLY_MARGIN = 0.05


@dataclass
class UnitRun:
    """One unit of a request: its name and what happened when it ran."""

    name: str
    result: CallResult
    read_facts: bool = False  # its plugin reads host facts: the call carried them (those the service has)
    facts: Any = None  # then the call's facts (a vmsched.facts.wire.PreparedFacts; None without a facts cache)
    unknown: bool = False  # no unit of that name and kind (or its file failed to load)


@dataclass(eq=False)
class UnitRunner:
    """Runs the units of one request in a plugin pool, as the services do (and vmsched.whatif's replay)."""

    catalog: Catalog
    pool: PluginPool
    timeout_for: Callable[[str], float]
    observe: Callable[[str, CallResult], None] | None = None

    def run(
        self, kind: Kind, names: list[str], args: tuple[Any, ...], deadline: float, timeout: float | None,
        facts: Callable[[], Any] | None = None,
    ) -> list[UnitRun]:
        """Run every named unit of ``kind`` in parallel; unknown names fail alone.

        ``args`` are the method's arguments (``KIND[kind].args(...)`` builds them); ``facts``
        builds the call's host facts (:meth:`PluginService.facts_for`), once, and only when a unit's plugin reads
        them: the others skip building, encoding and decoding them.
        """
        calls: list[Call] = []
        slots: list[int] = []
        built = None if facts is None else functools.cache(facts)  # called once, if a unit's plugin reads them
        runs = [UnitRun(name, CallResult(ok=False)) for name in names]
        for i, name in enumerate(names):
            unit = self.lookup(name, kind)
            if unit is None:
                runs[i].result = CallResult(ok=False, error=self.unknown(name, kind))
                runs[i].unknown = True
                continue
            budget = min(timeout or self.timeout_for(name), deadline - time.time() - REPLY_MARGIN)
            unit_facts = None
            if built is not None and self.catalog.uses_facts(unit.plugin):
                unit_facts = built()
                runs[i].read_facts, runs[i].facts = True, unit_facts
            calls.append(Call(unit.plugin, unit.name, KIND[kind].method, args, max(budget, 0.001), unit_facts))
            slots.append(i)
        if calls:
            for i, result in zip(slots, self.pool.run(calls, deadline=deadline - REPLY_MARGIN)):
                runs[i].result = result
                if self.observe is not None:
                    self.observe(names[i], result)
        return runs

    def unknown(self, name: str, kind: Kind) -> str:
        """Why unit ``name`` cannot run: the load error of its file when that file failed to load."""
        failed = self.catalog.load_error_of(name)
        if failed is not None:
            return f"{kind.value} unit {name!r} is in {failed.plugin}.py, which failed to load: {failed.error}"
        return f"unknown {kind.value} unit {name!r}"

    def lookup(self, name: str, kind: Kind):  # type: ignore[no-untyped-def]
        unit = self.catalog.unit(name, kind)
        if unit is None:  # a plugin may have just been added: look again after a rescan, which waits for the
            self.catalog.refresh()  # watcher's own rescan if one is under way, so its result counts too
            unit = self.catalog.unit(name, kind)
        return unit


def _common(run: UnitRun) -> dict[str, Any]:
    r = run.result
    return {"unit": run.name, "ok": r.ok, "error": r.error, "timed_out": r.timed_out,
            "duration": r.duration, "stderr": r.stderr}


Outcome = TypeVar("Outcome", FilterOutcome, ScoreOutcomeOnBus, BalanceOutcome)


def _read(outcome: Outcome, run: UnitRun, fill: Callable[[Outcome, Any], None]) -> Outcome:
    """``outcome`` filled (``fill``) with what a unit that ran returned, or failed with why that breaks the contract."""
    if run.result.ok:
        try:
            fill(outcome, run.result)
        except BadResult as exc:
            outcome.ok, outcome.error = False, str(exc)
    return outcome


def filter_outcome(run: UnitRun, hosts: list[str]) -> FilterOutcome:
    """A filter unit's outcome as the service reports it: the hosts it kept and its reasons, or why it failed."""

    def fill(outcome: FilterOutcome, result: CallResult) -> None:
        verdict = KIND[Kind.FILTER].read(result.value, hosts)
        outcome.hosts, outcome.reasons = verdict.value, verdict.reasons

    return _read(FilterOutcome(**_common(run)), run, fill)


def score_outcome(run: UnitRun, factor: int, hosts: list[str]) -> ScoreOutcomeOnBus:
    """A score unit's outcome: its numbers aligned with ``hosts`` (``values``) or its pairs, or why it failed."""

    def fill(outcome: ScoreOutcomeOnBus, result: CallResult) -> None:
        if result.scores is not None:  # its worker found them aligned (contract.aligned_scores)
            outcome.values = checked_aligned(result.scores, hosts)
        else:
            verdict = KIND[Kind.SCORE].read(result.value, hosts)
            outcome.scores, outcome.reasons = verdict.value, verdict.reasons

    return _read(ScoreOutcomeOnBus(**_common(run), factor=factor), run, fill)


def balance_outcome(run: UnitRun, hosts: list[str]) -> BalanceOutcome:
    """A balance unit's outcome: the VM it proposes to move and where, with its reasons, or why it failed."""

    def fill(outcome: BalanceOutcome, result: CallResult) -> None:
        verdict = KIND[Kind.BALANCE].read(result.value, hosts)
        outcome.vm, outcome.hosts = verdict.value
        outcome.reasons, outcome.reason = verdict.reasons, verdict.reason

    return _read(BalanceOutcome(**_common(run)), run, fill)
