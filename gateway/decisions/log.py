"""The gateway's decision log: what each unit did to each host, and why; kept in a bounded ring per operation.

:meth:`DecisionLog.submit` keeps a decision (:mod:`record`) in the :mod:`ring` on the request path, a few
microseconds. With ``--decisions-log`` an output thread writes each record as one JSON line to stdout. Nothing
is published per decision: with several replicas on RabbitMQ a reader's gateway asks the others when it is
read (:mod:`peers`) and merges their answers with its own ring (:meth:`DecisionLog.search`,
:meth:`DecisionLog.find`).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque
from typing import Any

import orjson

from vmsched.bus.interface import Transport
from vmsched.facts.cache import FactsCache
from vmsched.gateway.decisions.peers import MAX_ANSWER, Gathered, PeerLink
from vmsched.gateway.decisions.record import keep, matches, new_id
from vmsched.gateway.decisions.ring import Ring

log = logging.getLogger("vmsched.gateway.decisions")

#: records in one stdout write at most
BATCH = 200
#: how often the output thread writes the waiting records, seconds
PAUSE = 0.2
#: records waiting for the output thread at most; past it new ones are not written (counted in ``skipped``)
MAX_PENDING = 5000
#: how long a check that some host has facts holds, seconds (a decision's facts ages need it)
FACTS_CHECK = 0.2


class DecisionLog:
    """Owns the ring, the stdout output thread and, on RabbitMQ, the link to the peers."""

    def __init__(self, size: int, gateway: str, facts: FactsCache | None = None,
                 bus: Transport | None = None, stdout: bool = False) -> None:
        self.ring = Ring(size, gateway)
        self.gateway = gateway
        self.facts = facts
        self.stdout = stdout
        self.skipped = 0  # decisions not kept (a value that cannot be kept) or not written (MAX_PENDING waiting)
        self._facts_known = (False, float("-inf"))  # whether some host has facts, and when that was checked
        self._out: deque[tuple[str, float, bytes]] = deque()  # for the output thread
        self._writing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not size or (bus is not None and not bus.spans_processes):
            bus = None  # size 0: no decision log at all; the in-process bus: one process, no other gateway
        self.peers = PeerLink(bus, gateway, self.answer) if bus is not None else None

    # --- the request path -------------------------------------------------------------------------
    def submit(self, op: str, req: Any, decision: Any, outcomes: Any, bus_failed: bool, duration: float,
               record_id: str = "") -> None:
        """Keep the decision in the ring, as one bytes object (the request's objects die with it); ``record_id``:
        its ID (the call's, vmsched.gateway.engine.scheduler), else a new one."""
        try:
            data = orjson.dumps(keep(op, req, decision, outcomes, bus_failed, duration, self._ages(req.hosts)))
        except Exception:  # noqa: BLE001 - the log must never fail a scheduling request
            log.exception("keeping a %s decision failed", op)
            self.skipped += 1
            return
        record_id, at = record_id or new_id(), time.time()
        self.ring.put(op, record_id, at, data)
        if self._thread is not None:
            if len(self._out) >= MAX_PENDING:  # never let the backlog grow unbounded
                self.skipped += 1
            else:
                self._out.append((record_id, at, data))

    def _ages(self, hosts: list[str]) -> dict[str, float]:
        """Seconds since each host's facts were collected; a host without facts is left out."""
        if self.facts is None:
            return {}
        known, checked = self._facts_known
        now = time.monotonic()
        if now - checked > FACTS_CHECK:
            known = bool(self.facts.hosts())
            self._facts_known = (known, now)
        return self.facts.ages(hosts) if known else {}  # one pass; no lock for hosts whose agent reports the ID

    # --- readers: this ring and the other replicas' ------------------------------------------------
    async def search(self, limit: int = 100, **filters: Any) -> Gathered:
        """The newest ``limit`` records matching ``filters`` of every replica that answers in time."""
        own = self.ring.recent(limit, **filters)
        if self.peers is None:
            return Gathered(own)
        found = await self.peers.ask({"filters": _filters(filters), "limit": limit})
        merged: dict[str, dict[str, Any]] = {r["id"]: r for r in found.records if matches(r, **filters)}
        merged.update((r["id"], r) for r in own)
        found.records = sorted(merged.values(), key=lambda r: r["time"], reverse=True)[:limit]
        return found

    async def find(self, record_id: str) -> Gathered:
        """One record by ID: from this ring, else from the replica that has it."""
        record = self.ring.get(record_id)
        if record is not None or self.peers is None:
            return Gathered([record] if record is not None else [])
        found = await self.peers.ask({"id": record_id})
        found.records = [r for r in found.records if r["id"] == record_id][:1]
        return found

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
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.flush()
        if self.peers is not None:
            self.peers.stop()

    def flush(self) -> None:
        """Write what is waiting for the output thread now (tests, shutdown)."""
        with self._writing:
            while self._out:
                batch = [self._out.popleft() for _ in range(min(BATCH, len(self._out)))]
                lines = [r for r in (self.ring.record(*entry) for entry in batch) if r is not None]
                sys.stdout.write("".join(json.dumps({"event": "vmsched.decision", **r}, default=str) + "\n"
                                         for r in lines))
                sys.stdout.flush()

    def _output(self) -> None:
        """Every PAUSE seconds, the waiting records as JSON lines (no hand-off per decision)."""
        while not self._stop.wait(PAUSE):
            self.flush()


def _filters(given: dict[str, Any]) -> dict[str, Any]:
    """The reader filters, well typed (a question from another replica is data)."""
    out: dict[str, Any] = {}
    for name in ("vm", "host", "op"):
        value = given.get(name)
        out[name] = value[:256] if isinstance(value, str) and value else None
    out["errors_only"] = given.get("errors_only") is True
    return out

