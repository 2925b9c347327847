"""The ring: the newest decisions of each operation, each one bytes object, and an index by ID.

The :class:`Ring` keeps a record's bytes, its ID and time in preallocated slots, and nothing else: the garbage
collector tracks no object per decision (records kept as objects were promoted to the old generation and set
off full collections over the gateway's whole heap).
"""

from __future__ import annotations

import logging
import threading
from array import array
from typing import Any

import orjson

from vmsched.gateway.decisions.record import OPS, matches, record_of

log = logging.getLogger("vmsched.gateway.decisions")


class _Slots:
    """One operation's ring: parallel lists, a write position and an index from ID to slot."""

    __slots__ = ("ids", "times", "data", "next", "index")

    def __init__(self, size: int) -> None:
        self.ids: list[str | None] = [None] * size
        self.times = array("d", bytes(8 * size))  # no float object per decision
        self.data: list[bytes | None] = [None] * size
        self.next = 0
        self.index: dict[str, int] = {}  # str -> int: a dict the collector does not track


class Ring:
    """The newest ``size`` decisions of each operation, each one bytes object (what
    :func:`~vmsched.gateway.decisions.record.keep` keeps, as JSON), and an index by ID. Thread-safe: the event loop
    writes and reads, the output thread and the link to the other replicas read."""

    def __init__(self, size: int, gateway: str = "") -> None:
        self.size = size
        self.gateway = gateway
        self._lock = threading.Lock()
        self._ops = {op: _Slots(size) for op in OPS}

    def put(self, op: str, record_id: str, at: float, data: bytes) -> None:
        """A decision; the oldest of its operation leaves. The same ID twice is kept once."""
        ring = self._ops.get(op)
        if ring is None or not self.size:
            return
        with self._lock:
            if any(record_id in r.index for r in self._ops.values()):
                return
            slot = ring.next
            old = ring.ids[slot]
            if old is not None:
                del ring.index[old]
            ring.ids[slot], ring.times[slot], ring.data[slot] = record_id, at, data
            ring.index[record_id] = slot
            ring.next = (slot + 1) % self.size

    def record(self, record_id: str, at: float, data: bytes) -> dict[str, Any] | None:
        """The record of a slot's bytes; None (logged) when that fails: the log must never take the gateway down."""
        try:
            return record_of(orjson.loads(data), record_id, at, self.gateway)
        except Exception:  # noqa: BLE001
            log.exception("reading decision %s failed", record_id)
            return None

    def get(self, record_id: str) -> dict[str, Any] | None:
        with self._lock:
            for ring in self._ops.values():
                slot = ring.index.get(record_id)
                if slot is not None:
                    at, data = ring.times[slot], ring.data[slot]
                    break
            else:
                return None
        return self.record(record_id, at, data) if data is not None else None

    def recent(self, limit: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Newest first, across operations, matching :func:`matches`."""
        with self._lock:
            slots = [(ring.times[s], rid, ring.data[s]) for ring in self._ops.values() for rid, s in ring.index.items()]
        slots.sort(key=lambda x: x[0], reverse=True)
        found = []
        for at, record_id, data in slots:
            record = self.record(record_id, at, data) if data is not None else None
            if record is not None and matches(record, **filters):
                found.append(record)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def __len__(self) -> int:
        with self._lock:
            return sum(len(ring.index) for ring in self._ops.values())
