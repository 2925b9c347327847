"""The decision log's bounded ring: the newest ``size`` decisions of each operation, in preallocated slots.

A decision goes in as its compact parts (:func:`vmsched.gateway.decision_compact.compact`: one flat
tuple of strings and numbers, with the request's outcome around it) marshalled into **one bytes object**, and
its record is built from them when first read, then kept in the slot. The slots are a few lists and an array
made once: ringing a decision keeps its ID and that bytes object, nothing else. (An object per decision, kept
for as long as the ring keeps it, was promoted through the collector's generations and made it run full
collections over the gateway's whole heap; the flat tuple's few small objects, its strings and floats, kept
across the gateway's memory pools, still cost the request path about 1 % of its CPU on score calls, where
one bytes object per decision costs nothing measurable: docs/performance.md, "Decision log cost".)
Thread-safe: the event loop writes and reads, the output thread and the link to the other replicas read.
"""

from __future__ import annotations

import logging
import marshal
import threading
from array import array
from typing import Any

from vmsched.gateway import decision_compact, decisions

log = logging.getLogger("vmsched.gateway.decisions")

OPS = ("filter", "score", "balance")
#: what a slot keeps until its record is built: :func:`kept` of (compact parts, bus failed, gateway, duration,
#: facts age)
Parts = bytes


def kept(compact: decision_compact.Compact, bus_failed: bool, gateway: str, duration: float,
         facts_age: dict[str, float]) -> Parts:
    """A decision as a slot keeps it: one bytes object (about 2 us for a score decision on 100 hosts)."""
    return marshal.dumps((compact, bus_failed, gateway, duration, facts_age))


class _Slots:
    """One operation's ring: parallel lists, a write position and an index from ID to slot."""

    __slots__ = ("ids", "times", "parts", "records", "next", "index")

    def __init__(self, size: int) -> None:
        self.ids: list[str | None] = [None] * size
        self.times = array("d", bytes(8 * size))  # no float object per decision
        self.parts: list[Parts | None] = [None] * size
        self.records: list[dict[str, Any] | None] = [None] * size
        self.next = 0
        self.index: dict[str, int] = {}  # str -> int: a dict the collector does not track


def build(record_id: str, at: float, parts: Parts) -> dict[str, Any] | None:
    """A record from a slot's parts; None (logged) when that fails: the log must never take the gateway down."""
    try:
        compact, bus_failed, gateway, duration, facts_age = marshal.loads(parts)
        return decision_compact.build_compact(compact, bus_failed=bus_failed, gateway=gateway, duration=duration,
                                       facts_age=facts_age, at=at, record_id=record_id)
    except Exception:  # noqa: BLE001
        log.exception("recording decision %s failed", record_id)
        return None


class Ring:
    """The newest ``size`` decisions of each operation, and an index by ID."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._building = threading.Lock()  # one build at a time: the loop and the output thread may both ask
        self._ops = {op: _Slots(size) for op in OPS}

    def put(self, op: str, record_id: str, at: float, parts: Parts | None = None,
            record: dict[str, Any] | None = None) -> None:
        """A decision: its parts (built when first read) or its built record. The oldest of its operation leaves."""
        ring = self._ops.get(op)
        if ring is None or not self.size:
            return
        with self._lock:
            if any(record_id in r.index for r in self._ops.values()):
                return  # the same decision twice
            slot = ring.next
            old = ring.ids[slot]
            if old is not None:
                del ring.index[old]
            ring.ids[slot], ring.times[slot], ring.parts[slot], ring.records[slot] = record_id, at, parts, record
            ring.index[record_id] = slot
            ring.next = (slot + 1) % self.size

    def add(self, record: dict[str, Any]) -> None:
        """A built record (a test's)."""
        if isinstance(record.get("id"), str) and isinstance(record.get("time"), (int, float)):
            self.put(record.get("op", ""), record["id"], record["time"], record=record)

    def keep(self, op: str, record_id: str, record: dict[str, Any]) -> None:
        """A record built elsewhere (the output thread) for a decision still in the ring."""
        ring = self._ops[op]
        with self._lock:
            slot = ring.index.get(record_id)
            if slot is not None and ring.records[slot] is None:
                ring.records[slot], ring.parts[slot] = record, None

    def _record(self, ring: _Slots, slot: int, record_id: str) -> dict[str, Any] | None:
        with self._lock:
            if ring.ids[slot] != record_id:
                return None  # it left the ring meanwhile
            record, parts, at = ring.records[slot], ring.parts[slot], ring.times[slot]
        if record is not None or parts is None:
            return record
        with self._building:
            with self._lock:
                if ring.ids[slot] == record_id and ring.records[slot] is not None:
                    return ring.records[slot]
            record = build(record_id, at, parts)
            with self._lock:
                if ring.ids[slot] == record_id:
                    ring.records[slot], ring.parts[slot] = record, None
        return record

    def get(self, record_id: str) -> dict[str, Any] | None:
        for ring in self._ops.values():
            with self._lock:
                slot = ring.index.get(record_id)
            if slot is not None:
                return self._record(ring, slot, record_id)
        return None

    def recent(self, limit: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Newest first, across operations, matching :func:`decisions.matches`."""
        with self._lock:
            slots = [(ring.times[s], ring, s, rid) for ring in self._ops.values() for rid, s in ring.index.items()]
        slots.sort(key=lambda x: x[0], reverse=True)
        found = []
        for _, ring, slot, record_id in slots:
            record = self._record(ring, slot, record_id)
            if record is not None and decisions.matches(record, **filters):
                found.append(record)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def __len__(self) -> int:
        with self._lock:
            return sum(len(ring.index) for ring in self._ops.values())
