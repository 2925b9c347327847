"""A shadow candidate on live traffic: a changed policy run beside the live one, never in its way.

As in GitHub's Scientist, the live decision is the control and the only one the engine gets. After a service
has made a live call's reply, :meth:`Shadow.offer` queues the call (its arguments, the facts its units could
read, the live outcomes) and returns at once; the candidate (a plugins folder in sandboxed workers of its own,
:class:`~vmsched.whatif.replay.Policy`, with changed factors or units left out: :class:`~.replay.Change`) runs
it on a thread of the shadow, and the two decisions are compared (:mod:`.compare`). A call that finds the queue
full is shed. The candidate's errors, hangs and time never reach the live path: a unit that fails or times out
makes the comparison an ``error``, a failure of the shadow itself is logged and counted the same way.

Each comparison is counted (``vmsched_shadow_total{outcome}``: same, changed, unknown, error, shed) and
published on ``vmsched.events`` under ``shadow.<service>`` as a :class:`~vmsched.messages.ShadowComparison`;
every gateway keeps them beside its decisions (the API's ``/v1/shadow``, the console's what-if view).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from vmsched.bus.interface import EventSink
from vmsched.facts.wire import PreparedFacts
from vmsched.messages import SHADOW_KEY, SHADOW_ROWS, ShadowComparison, ShadowHost
from vmsched.metrics import REGISTRY
from vmsched.whatif.compare import Comparison, Side, best, compare, decide, explain
from vmsched.whatif.replay import Change, Policy

log = logging.getLogger("vmsched.shadow")

SHADOWED = Counter("vmsched_shadow_total", "Live calls given to the shadow candidate, by outcome: same, changed, "
                   "unknown (the candidate lacks a unit), error (a candidate unit failed or timed out), shed (the "
                   "shadow was behind: not run)", ["outcome"], registry=REGISTRY)
OUTCOMES = ("same", "changed", "unknown", "error", "shed")
for _outcome in OUTCOMES:
    SHADOWED.labels(_outcome)  # every series at 0 from start-up (docs/deploy/monitoring.md)

#: seconds between two log lines about the shadow's own failures
_LOG_EVERY = 60.0
#: seconds the shadow lets pass after a call is offered before running it: the live reply leaves the process
#: (in the all-in-one, the gateway's answer to the engine too) without sharing the interpreter with the candidate
SETTLE = 0.005


@dataclass(frozen=True)
class ShadowCall:
    """One answered live call, as the candidate gets it: never shared with the live reply."""

    id: str  # the call's ID (its decision's at the gateway)
    op: str
    hosts: list[str]
    vm: str
    properties: dict[str, str]
    units: list[tuple[str, int]]  # the live units and their factors
    facts: PreparedFacts | None  # what the live units could read
    live: list[Any]  # the live outcomes (copies: deciding pairs a score unit's values with the hosts)
    at: float = field(default_factory=time.monotonic)  # when it was offered


class Shadow:
    """A candidate ``policy`` beside a service's live calls: a share ``rate`` of them, at most ``depth``
    waiting, ``threads`` running at once; comparisons published on ``events`` as ``service``."""

    def __init__(self, policy: Policy, service: str, events: EventSink, change: Change = Change(),
                 rate: float = 1.0, depth: int = 16, threads: int = 1, rescan: float = 0.0) -> None:
        self.policy = policy
        self.service = service
        self.events = events
        self.change = change
        self.rate = rate
        self.rescan = rescan
        self._queue: queue.Queue[ShadowCall | None] = queue.Queue(maxsize=max(1, depth))
        self._threads = [threading.Thread(target=self._serve, name=f"{service}-shadow-{i}", daemon=True)
                         for i in range(max(1, threads))]
        self._logged = 0.0

    def start(self) -> Shadow:
        self.policy.start()
        if self.rescan > 0:
            self.policy.catalog.start_watching(self.rescan)  # a candidate edited in place is taken up live
        for thread in self._threads:
            thread.start()
        log.info("%s: shadowing %d%% of calls with %s%s", self.service, round(self.rate * 100),
                 self.policy.folder, f" ({'; '.join(self.change.describe())})" if self.change.describe() else "")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Drop what waits, let the running calls end (at most ``timeout`` seconds), close the candidate."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.policy.close()
        self.events.close()

    def sampled(self) -> bool:
        """Whether the shadow takes the next call (``rate``); the service then keeps the call's facts for it."""
        return self.rate >= 1.0 or random.random() < self.rate

    def offer(self, call: ShadowCall) -> None:
        """Queue an answered call for the candidate, or shed it when the shadow is behind; returns at once."""
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            SHADOWED.labels("shed").inc()

    # --- the shadow's threads ------------------------------------------------------------------------------
    def _serve(self) -> None:
        while (call := self._queue.get()) is not None:
            wait = call.at + SETTLE - time.monotonic()
            if wait > 0:  # a backlog waited already
                time.sleep(wait)
            try:
                found = self.run(call)
            except Exception as exc:  # noqa: BLE001 - the shadow's own failure is counted, never raised
                found = self._failed(call, exc)
            SHADOWED.labels(found.status).inc()
            self.events.publish(SHADOW_KEY + self.service, found.model_dump(exclude={"service", "time"}))

    def run(self, call: ShadowCall) -> ShadowComparison:
        """The candidate's run of ``call``, compared with the live decision."""
        units = self.change.units(call.op, call.units)
        started = time.perf_counter()
        cand = self.policy.run(call.op, call.hosts, call.vm, call.properties, units, call.facts)
        seconds = time.perf_counter() - started
        live = decide(call.op, call.hosts, call.live)
        found = compare(call.op, call.hosts, live, cand)
        errors = {o.unit: "timed out" if o.timed_out else (o.error or "failed")
                  for o in cand.outcomes if not o.ok and o.unit not in cand.unknown}
        status, what = found.status, found.what
        if errors and status != "unknown":
            status = "error"
            what = f"{_units(errors)} of the candidate failed; {what}"
        return ShadowComparison(
            id=call.id, op=call.op, vm=call.vm, hosts=len(call.hosts), status=status, what=what, tie=found.tie,
            rank=found.rank, unknown=found.unknown, errors={u: e[:500] for u, e in errors.items()},
            candidate=self.policy.folder.name, change=self.change.describe(), seconds=seconds,
            rows=rows(call.op, call.hosts, live, cand, found) if found.changed else [])

    def _failed(self, call: ShadowCall, exc: Exception) -> ShadowComparison:
        if time.monotonic() - self._logged > _LOG_EVERY:
            self._logged = time.monotonic()
            log.warning("%s: the shadow candidate could not run call %s: %s: %s (the live reply was not "
                        "affected)", self.service, call.id, type(exc).__name__, exc)
        return ShadowComparison(id=call.id, op=call.op, vm=call.vm, hosts=len(call.hosts), status="error",
                                what=f"the shadow could not run the candidate: {type(exc).__name__}: {exc}"[:2000],
                                candidate=self.policy.folder.name, change=self.change.describe(), seconds=0.0)


def rows(op: str, hosts: list[str], live: Side, cand: Side, found: Comparison) -> list[ShadowHost]:
    """The hosts of a changed call whose result differs, explained per unit on both sides: the best-ranked or
    proposed hosts of either side first, at most :data:`~vmsched.messages.SHADOW_ROWS`."""
    a, b = explain(op, hosts, live), explain(op, hosts, cand)
    if op == "score":
        first = best(live) + best(cand)
    elif op == "balance":
        first = list(live.decision.result[1]) + list(cand.decision.result[1])
    else:
        first = []
    order = list(dict.fromkeys(first + hosts))
    differ = [h for h in order if h in a and a[h].get("result") != b[h].get("result")]
    return [ShadowHost(host=h, live=a[h], candidate=b[h]) for h in differ[:SHADOW_ROWS]]


def _units(errors: dict[str, str]) -> str:
    names = sorted(errors)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
