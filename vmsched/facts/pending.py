"""Pending placements: VMs vmsched ranked first moments ago, whose memory the host facts do not show yet.

Like oVirt's pending resources, so that a burst of starts does not double-book
one host. vmsched never learns the engine's choice, so this is an
approximation (docs/stock-units.md, "Pending placements"):

* **which host:** when a runCostFunctions call for a VM of known memory has one
  best-ranked host (lowest ``factor x score`` total, a host a unit did not
  score counting as that unit's worst, as the engine gets it), that host is
  taken as the engine's choice; a tie records nothing (the engine's own
  units break it, and counting the VM on every tied host would wrongly fill
  them all);
* **until when:** until the VM shows up in some host's facts other than the
  host it ran on when it was ranked (a start or a finished migration), or
  ``TTL`` seconds; ranking the VM again replaces its entry;
* **where it is known:** per service replica (each scoring replica records the
  calls it served).

The scoring service records (:meth:`PendingBook.placed`) and attaches the
view to each call's VM facts (:func:`attach`); ``vmsched.plugin.facts.pending``
reads it in a unit.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

#: Seconds a placement stays pending at most (the agent sees a start within its event-driven collection).
TTL = 60.0
#: Most placements kept (the oldest go first).
MAX_ENTRIES = 10000


class VmFacts(Protocol):
    def vm(self, vm: str) -> tuple[dict[str, Any] | None, str | None]: ...


@dataclass(frozen=True)
class Placement:
    host: str  # the engine host ID taken as the engine's choice
    memory_mib: int
    since: float  # time.time() of the ranking
    was_on: str  # the host the VM ran on then ("" when not running on a host with facts)


def best_host(hosts: Sequence[str], units: Iterable[tuple[int, Sequence[tuple[str, float]]]]) -> str | None:
    """The one host with the lowest total of ``factor x score`` over the units, or None (no units, a tie)."""
    totals = dict.fromkeys(hosts, 0.0)
    used = False
    for factor, scores in units:
        scored = {h: float(s) for h, s in scores if h in totals}
        if not scored:
            continue
        used = True
        worst = max(factor * s for s in scored.values())  # the unit's worst part, whatever the factor's sign
        for h in totals:
            totals[h] += factor * scored[h] if h in scored else worst
    if not used or not totals:
        return None
    low = min(totals.values())
    best = [h for h, t in totals.items() if t == low]
    return best[0] if len(best) == 1 else None


class PendingBook:
    def __init__(self, ttl: float = TTL) -> None:
        self.ttl = ttl
        self._entries: OrderedDict[str, Placement] = OrderedDict()  # VM ID -> its placement
        self._lock = threading.Lock()

    def placed(self, facts: VmFacts, vm: str, hosts: Sequence[str],
               units: Iterable[tuple[int, Sequence[tuple[str, float]]]]) -> str | None:
        """Record a ranking's best host for ``vm`` when its memory is known; the host, or None.

        ``units`` is read only then (a generator may build the pairs lazily)."""
        if not vm:
            return None
        view = facts.vm(vm)[0]
        if not isinstance(view, dict) or int(view.get("memory_mib") or 0) <= 0:
            return None
        host = best_host(hosts, units)
        if host is None:
            return None
        was_on = str(view.get("host_id") or "") if view.get("source") == "host facts" else ""
        if host == was_on:
            return None  # it stays where it runs
        with self._lock:  # the newest last: the oldest go first
            self._entries.pop(vm, None)
            self._entries[vm] = Placement(host, int(view["memory_mib"]), time.time(), was_on)
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)
        return host

    def view(self, facts: VmFacts, exclude: str = "", now: float | None = None) -> dict[str, list[int]]:
        """Host -> memory (MiB) of each VM pending there, without ``exclude``; expired or arrived ones dropped."""
        now = time.time() if now is None else now
        with self._lock:
            entries = list(self._entries.items())
        out: dict[str, list[int]] = {}
        done = []
        for vm, p in entries:
            if now - p.since > self.ttl or _arrived(facts, vm, p):
                done.append((vm, p))
            elif vm != exclude:
                out.setdefault(p.host, []).append(p.memory_mib)
        if done:
            with self._lock:
                for vm, p in done:
                    if self._entries.get(vm) is p:
                        del self._entries[vm]
        return out

    def __len__(self) -> int:
        return len(self._entries)


def _arrived(facts: VmFacts, vm: str, placement: Placement) -> bool:
    """The VM runs on a host with facts other than the one it ran on when it was ranked."""
    view = facts.vm(vm)[0]
    return (isinstance(view, dict) and view.get("source") == "host facts"
            and str(view.get("host_id") or "") != placement.was_on)


def attach(call_facts: Any, pending: Callable[[], dict[str, list[int]]]) -> Any:
    """Add the pending view to a call's VM facts (its ``vm`` dict: :class:`~vmsched.facts.wire.PreparedFacts`).

    ``pending`` is asked only when the call's VM is known (a VM of unknown size gets nothing to count).
    """
    found = getattr(call_facts, "vm", None)
    if isinstance(found, dict):
        view = pending()
        if view:
            call_facts.vm = {**found, "pending": view}
    return call_facts
