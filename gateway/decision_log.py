"""The gateway's decision log: a bounded ring per operation, filled off the request path.

:meth:`DecisionLog.submit` is all the request path pays: it keeps the
decision in its compact form (:mod:`vmsched.gateway.decision_compact`: no
object of the request outlives it). Every :data:`PAUSE` seconds the event
loop, between requests and in one go, puts the waiting ones in the ring
(:mod:`vmsched.gateway.decision_ring`); a record
(:mod:`vmsched.gateway.decisions`) is built from its compact form when first
read. With ``--decisions-log`` an output thread writes
each record as one JSON line to stdout. Nothing is published per decision:
with several replicas on RabbitMQ a reader's gateway asks the others when it
is read (:mod:`vmsched.gateway.decision_peers`) and merges their answers
with its own ring (:meth:`DecisionLog.search`, :meth:`DecisionLog.find`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import re
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vmsched.bus.connection import BusOptions
from vmsched.facts_cache import FactsCache
from vmsched.gateway import decision_compact, decision_ring, decisions
from vmsched.gateway.decision_peers import MAX_ANSWER, Gathered, PeerLink
from vmsched.gateway.decision_ring import Ring

log = logging.getLogger("vmsched.gateway.decisions")

#: records in one stdout write at most
BATCH = 200
#: how long a decision waits for its batch to be recorded, seconds
PAUSE = 0.2
#: decisions waiting for the batch at most; past it new ones are counted in ``skipped``, not kept
MAX_PENDING = 5000


def gateway_label(configured: str = "") -> str:
    """A routing-key-safe label of this gateway: the setting, else the host name."""
    label = re.sub(r"[^A-Za-z0-9_-]", "-", configured or socket.gethostname())[:64]
    return label or "gateway"


@dataclass
class Found:
    """Records found for a reader: this gateway's and the other replicas' that answered."""

    records: list[dict[str, Any]]
    answered: list[str] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)

    def replicas(self, gateway: str) -> dict[str, Any]:
        """The ``replicas`` part of an API answer: who answered, who did not and why."""
        return {"answered": [gateway, *self.answered], "missing": self.missing, "truncated": self.truncated}


class DecisionLog:
    """Owns the ring, the batching of records, the stdout output thread and, on RabbitMQ, the link to the peers."""

    def __init__(self, size: int, gateway: str, facts: FactsCache | None = None,
                 bus: BusOptions | None = None, stdout: bool = False) -> None:
        self.ring = Ring(size)
        self.gateway = gateway
        self.facts = facts
        self.stdout = stdout
        self.skipped = 0  # decisions not recorded because MAX_PENDING were waiting
        self._pending: deque[tuple[Any, ...]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._out: queue.SimpleQueue[list[tuple[Any, ...]] | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if not size or (bus is not None and bus.embedded):
            bus = None  # size 0: no decision log at all; the embedded bus: one process, no other gateway
        self.peers = PeerLink(bus, gateway, self.answer) if bus is not None else None

    # --- the request path -------------------------------------------------------------------------
    def submit(self, op: str, req: Any, decision: Any, outcomes: Any, bus_failed: bool, duration: float) -> None:
        """Keep the decision in its compact form (the request's objects die with it); on the event loop, the waiting
        ones are ringed every PAUSE s."""
        if len(self._pending) >= MAX_PENDING:  # never let the backlog grow unbounded
            self.skipped += 1
            return
        try:
            parts = decision_compact.compact(op, req, decision, outcomes)
        except Exception:  # noqa: BLE001 - the log must never fail a scheduling request
            log.exception("keeping a %s decision failed", op)
            self.skipped += 1
            return
        self._pending.append((parts, bus_failed, duration, time.time()))
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(PAUSE, self.record_pending)
            except RuntimeError:  # not on an event loop (tests, tools): record at once
                self.record_pending()

    # --- the batch ----------------------------------------------------------------------------------
    def record_pending(self) -> None:
        """Ring the waiting decisions (one go, on the caller's thread: no hand-off per decision); their records
        are built when first read, or by the output thread for stdout."""
        self._timer = None
        facts_known = self.facts is not None and bool(self.facts.hosts())
        batch = []
        while self._pending:
            parts, bus_failed, duration, at = self._pending.popleft()
            record_id = decisions.new_id()
            ages = self._ages(decision_compact.hosts(parts)) if facts_known else {}
            try:
                kept = decision_ring.kept(parts, bus_failed, self.gateway, duration, ages)  # one bytes object
            except ValueError:  # noqa: PERF203 - an unmarshallable cell (a bug): that decision alone is lost
                log.exception("keeping a %s decision failed", parts[0])
                self.skipped += 1
                continue
            self.ring.put(parts[0], record_id, at, kept)
            if self._thread is not None:
                batch.append((parts[0], record_id, at, kept))
        if batch and self._thread is not None:
            for start in range(0, len(batch), BATCH):
                self._out.put(batch[start:start + BATCH])

    # --- readers: this ring and the other replicas' ------------------------------------------------
    async def search(self, limit: int = 100, **filters: Any) -> Found:
        """The newest ``limit`` records matching ``filters`` of every replica that answers in time."""
        own = self.ring.recent(limit, **filters)
        if self.peers is None:
            return Found(own)
        gathered = await self.peers.ask({"filters": _filters(filters), "limit": limit})
        merged: dict[str, dict[str, Any]] = {r["id"]: r for r in gathered.records if decisions.matches(r, **filters)}
        merged.update((r["id"], r) for r in own)
        records = sorted(merged.values(), key=lambda r: r["time"], reverse=True)[:limit]
        return _found(records, gathered)

    async def find(self, record_id: str) -> Found:
        """One record by ID: from this ring, else from the replica that has it."""
        record = self.ring.get(record_id)
        if record is not None or self.peers is None:
            return Found([record] if record is not None else [])
        gathered = await self.peers.ask({"id": record_id})
        return _found([r for r in gathered.records if r["id"] == record_id][:1], gathered)

    def answer(self, question: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        """Another replica's question, from this ring (on the peer link's thread): records, and whether cut."""
        if isinstance(question.get("id"), str):
            record = self.ring.get(question["id"])
            return ([record] if record is not None else []), False
        filters = question.get("filters") if isinstance(question.get("filters"), dict) else {}
        limit = question.get("limit")
        limit = min(limit, 10000) if isinstance(limit, int) and limit > 0 else 100
        records, size = [], 0
        for record in self.ring.recent(limit, **_filters(filters)):
            size += len(json.dumps(record, default=str))
            if size > MAX_ANSWER:
                return records, True
            records.append(record)
        return records, False

    # --- the output thread ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.stdout:
            self._thread = threading.Thread(target=self._output, name="gateway-decisions", daemon=True)
            self._thread.start()
        if self.peers is not None:
            self.peers.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.record_pending()
        self._out.put(None)
        if self._thread is not None:
            self._thread.join(5)
        if self.peers is not None:
            self.peers.stop()

    def flush(self, timeout: float = 5.0) -> None:
        """Record what is waiting and wait until it is out (tests, shutdown); call it on the loop's thread."""
        if self._timer is not None:
            self._timer.cancel()
        self.record_pending()
        if self._thread is not None:
            done = threading.Event()
            self._out.put(done)
            done.wait(timeout)

    def _output(self) -> None:
        while (entries := self._out.get()) is not None:
            if isinstance(entries, threading.Event):
                entries.set()
                continue
            item = []
            for op, record_id, at, kept in entries:
                record = decision_ring.build(record_id, at, kept)
                if record is not None:
                    self.ring.keep(op, record_id, record)
                    item.append(record)
            sys.stdout.write("".join(json.dumps({"event": "vmsched.decision", **r}, default=str) + "\n"
                                     for r in item))
            sys.stdout.flush()

    def _ages(self, hosts: tuple[str, ...]) -> dict[str, float]:
        """Seconds since each host's facts were collected; a host without facts is left out."""
        if self.facts is None:
            return {}
        return self.facts.ages(hosts)  # one pass; no lock for hosts whose agent reports the engine's ID


def _filters(given: dict[str, Any]) -> dict[str, Any]:
    """The reader filters, well typed (a question from another replica is data)."""
    out: dict[str, Any] = {}
    for name in ("vm", "host", "op"):
        value = given.get(name)
        out[name] = value[:256] if isinstance(value, str) and value else None
    out["errors_only"] = given.get("errors_only") is True
    return out


def _found(records: list[dict[str, Any]], gathered: Gathered) -> Found:
    return Found(records, gathered.answered, gathered.missing, gathered.truncated)
