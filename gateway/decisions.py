"""The gateway's decision log: what each unit did to each host, and why; kept in a bounded ring per operation.

A decision is kept as a :class:`Kept` record (plain values by name: no object of the request, the units'
outcomes or the engine's decision outlives it), serialised into **one bytes object** (JSON) on the request path
(:meth:`DecisionLog.submit`, a few microseconds). The :class:`Ring` keeps that bytes object, its ID and time in
preallocated slots, and nothing else: the garbage collector tracks no object per decision (records kept as
objects were promoted to the old generation and set off full collections over the gateway's whole heap).
The JSON-able record a reader gets (:meth:`Kept.record`) is built
from the bytes when read, with a plain-language ``summary`` ("kept 3 of 5 hosts: vmsched_Memory dropped 2 (h1:
free 1.2 GiB < 4.1 GiB needed; h3: ...)", with the reasons units gave, :mod:`vmsched.runtime.contract`;
:data:`SUMMARIES`), and :func:`matches` answers the ``GET /v1/decisions`` filters.

With ``--decisions-log`` an output thread writes each record as one JSON line to stdout. Nothing is published
per decision: with several replicas on RabbitMQ a reader's gateway asks the others when it is read
(:mod:`vmsched.gateway.decision_peers`) and merges their answers with its own ring (:meth:`DecisionLog.search`,
:meth:`DecisionLog.find`). Everything a plugin supplied (errors, host IDs it returned) is kept as data; whoever
renders it must escape it.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import socket
import sys
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import orjson

from vmsched.bus.interface import Transport
from vmsched.facts.cache import FactsCache
from vmsched.gateway.decision_peers import MAX_ANSWER, Gathered, PeerLink
from vmsched.gateway.render import ALL_FILTERS_FAILED, Decision
from vmsched.gateway.scores import finite

log = logging.getLogger("vmsched.gateway.decisions")

OPS = ("filter", "score", "balance")
#: hosts named in one summary clause at most
SHOWN = 3
#: records in one stdout write at most
BATCH = 200
#: how often the output thread writes the waiting records, seconds
PAUSE = 0.2
#: records waiting for the output thread at most; past it new ones are not written (counted in ``skipped``)
MAX_PENDING = 5000
#: how long a check that some host has facts holds, seconds (a decision's facts ages need it)
FACTS_CHECK = 0.2

_ID_PREFIX = secrets.token_hex(8)  # this process's; IDs differ across gateway replicas and restarts
_ID_COUNTER = itertools.count()


def new_id() -> str:
    """A decision ID: 32 hex digits, a random per-process prefix and a counter (no system call per record)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def gateway_label(configured: str = "") -> str:
    """A routing-key-safe label of this gateway: the setting, else the host name."""
    label = re.sub(r"[^A-Za-z0-9_-]", "-", configured or socket.gethostname())[:64]
    return label or "gateway"


# --- the record ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kept:
    """One decision as the ring keeps it: plain values (strings, numbers, lists, dicts), by name.

    ``units`` holds each unit's outcome as a dict: ``unit``, ``kind``, ``ok``, ``error``, ``timed_out``,
    ``duration``, ``reasons``, and by kind ``dropped`` (filter: the requested hosts it dropped), ``factor`` and
    ``scores`` (score: its ``(host, score)`` pairs), ``vm``, ``hosts`` and ``reason`` (balance).
    """

    op: str
    vm: str
    unit: str  # the balancer asked (balance); "" otherwise
    hosts: list[str]
    units: list[dict[str, Any]]
    result: Any
    plugin_errors: dict[str, list[str]]
    errors: list[str]
    bus_failed: bool
    duration: float
    facts_age: dict[str, float] = field(default_factory=dict)
    missing_facts: dict[str, Any] | None = None  # messages.MissingFacts as a dict

    def dumps(self) -> bytes:
        """One bytes object, JSON (TypeError for a value JSON cannot carry: a bug upstream). A non-finite float
        is written as null, as the record shows it."""
        return orjson.dumps({name: getattr(self, name) for name in _FIELDS})

    @classmethod
    def loads(cls, data: bytes) -> Kept:
        return cls(**orjson.loads(data))

    def record(self, record_id: str, at: float, gateway: str) -> dict[str, Any]:
        """The record readers get (the API, the console, the other replicas, the stdout line)."""
        units = [_unit_record(u, self.hosts) for u in self.units]
        nothing_ran = not units
        all_failed = bool(units) and not any(u["ok"] for u in units)
        record: dict[str, Any] = {
            "id": record_id,
            "time": at,
            "op": self.op,
            "gateway": gateway,
            "vm": self.vm,
            "hosts": list(self.hosts),
            "units": units,
            "result": self.result,
            "result_code": 1 if self.plugin_errors or self.errors else 0,
            "plugin_errors": self.plugin_errors,
            "errors": list(self.errors),
            "fallback": self.bus_failed or nothing_ran or all_failed or ALL_FILTERS_FAILED in self.errors,
            "duration": round(self.duration, 6),
            "facts_age": self.facts_age,
            "missing_facts": self.missing_facts,
        }
        if self.op == "balance":
            record["unit"] = self.unit
        record["summary"] = SUMMARIES[self.op](record)
        return record


_FIELDS = tuple(f.name for f in fields(Kept))


def keep(op: str, req: Any, decision: Decision, outcomes: Any, bus_failed: bool, duration: float,
         facts_age: dict[str, float] | None = None) -> Kept:
    """What the log keeps of one decision; ``outcomes`` as the operation's ``outcomes``/``no_outcomes`` gave them
    (a list of outcomes, or a balance's one outcome or None)."""
    hosts = list(req.hosts)
    if op == "filter":
        units = _filter_units(hosts, outcomes or [], decision.dropped)
    elif op == "score":
        units = [_score_unit(o) for o in outcomes or []]
    else:
        units = [_balance_unit(outcomes)] if outcomes is not None else []
    # req.unit only on a balance request: getattr(req, "unit", "") on another one makes pydantic raise (slow)
    return Kept(op=op, vm=req.vm if op != "balance" else "", unit=req.unit if op == "balance" else "", hosts=hosts,
                units=units, result=decision.result, plugin_errors=decision.plugin_errors,
                errors=decision.errors, bus_failed=bus_failed, duration=duration, facts_age=facts_age or {},
                missing_facts=decision.missing_facts.model_dump() if decision.missing_facts is not None else None)


def build(op: str, req: Any, decision: Decision, outcomes: Any, *, bus_failed: bool, gateway: str,
          duration: float, facts_age: dict[str, float] | None = None,
          at: float | None = None, record_id: str | None = None) -> dict[str, Any]:
    """The record of one decision, at once (what the ring gives a reader later)."""
    kept = keep(op, req, decision, outcomes, bus_failed, duration, facts_age)
    return kept.record(record_id or new_id(), time.time() if at is None else at, gateway)


def _head(o: Any) -> dict[str, Any]:
    return {"unit": o.unit, "kind": o.kind, "ok": o.ok, "error": o.error, "timed_out": o.timed_out,
            "duration": o.duration, "reasons": o.reasons}


def _filter_units(hosts: list[str], outcomes: list[Any], dropped: list[set[str] | None] | None) -> list[dict[str, Any]]:
    """Each filter unit keeps the hosts it dropped, not the ones it kept: filter_decision's sets when it made them
    (one per outcome), else worked out here. A failing filter drops nothing."""
    if dropped is None or len(dropped) != len(outcomes):
        offered = set(hosts)
        dropped = [offered.difference(o.hosts) if o.ok else None for o in outcomes]
    units = []
    for o, gone in zip(outcomes, dropped):
        unit = _head(o)
        unit["dropped"] = list(gone) if o.ok and gone else []
        units.append(unit)
    return units


def _score_unit(o: Any) -> dict[str, Any]:
    unit = _head(o)
    unit["factor"], unit["scores"] = o.factor, o.scores
    return unit


def _balance_unit(o: Any) -> dict[str, Any]:
    unit = _head(o)
    unit["vm"], unit["hosts"], unit["reason"] = o.vm, o.hosts, o.reason
    return unit


def _unit_record(kept: dict[str, Any], hosts: list[str]) -> dict[str, Any]:
    unit = {"unit": kept["unit"], "kind": kept["kind"], "ok": kept["ok"], "error": kept["error"],
            "timed_out": kept["timed_out"], "duration": round(kept["duration"], 6), "reasons": dict(kept["reasons"])}
    if "dropped" in kept:
        gone = set(kept["dropped"])
        unit["dropped"] = [h for h in hosts if h in gone]  # in the engine's order
    if "scores" in kept:
        unit["factor"] = kept["factor"]
        # JSON has no infinity: a plugin's infinite score shows as null (strict JSON for the API and the log lines)
        unit["scores"] = {h: s if finite(s) else None for h, s in kept["scores"]}
    if "reason" in kept:
        unit["vm"], unit["hosts"], unit["reason"] = kept["vm"], list(kept["hosts"]), kept["reason"]
    return unit


def for_reader(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the API shows it: a filter unit's ``kept`` hosts spelled out (the ring keeps only ``dropped``)."""
    if record.get("op") != "filter":
        return record
    hosts = record["hosts"]
    units = []
    for u in record["units"]:
        dropped = set(u.get("dropped", []))
        units.append({**u, "kept": [h for h in hosts if h not in dropped]})
    return {**record, "units": units}


def has_errors(record: dict[str, Any]) -> bool:
    return bool(record["result_code"] or record["fallback"] or any(not u["ok"] for u in record["units"]))


def matches(record: dict[str, Any], vm: str | None = None, host: str | None = None, op: str | None = None,
            errors_only: bool = False) -> bool:
    """The ``GET /v1/decisions`` filters; ``host`` matches a host the engine offered or a unit proposed."""
    if op and record["op"] != op:
        return False
    if vm and record["vm"] != vm and not any(u.get("vm") == vm for u in record["units"]):
        return False
    if host and host not in record["hosts"]:
        return False
    return not errors_only or has_errors(record)


# --- summaries: one line per record, by operation ---------------------------------------------------------------

def _short(hosts: list[str]) -> str:
    shown = ", ".join(h for h in hosts[:SHOWN])
    return shown + (f" and {len(hosts) - SHOWN} more" if len(hosts) > SHOWN else "")


def _failed_clauses(units: list[dict[str, Any]]) -> list[str]:
    out = []
    for u in units:
        if not u["ok"]:
            what = "timed out" if u["timed_out"] else f"failed ({_failure_text(u)})"
            out.append(f"{u['unit']} {what}, ignored")
    return out


def _failure_text(u: dict[str, Any]) -> str:
    text = (u.get("error") or "").strip()
    return text.splitlines()[0][:160] if text else "no reason given"


def _reason_text(u: dict[str, Any], hosts: list[str]) -> str:
    """``h1, h2: why; h3: other`` (hosts grouped by the unit's reason), or just the hosts without reasons."""
    reasons = u.get("reasons") or {}
    if not any(h in reasons for h in hosts):
        return _short(hosts)
    groups: dict[str, list[str]] = {}
    for h in hosts:
        groups.setdefault(reasons.get(h, ""), []).append(h)
    parts = [f"{_short(hs)}: {why}" if why else _short(hs) for why, hs in groups.items()]
    more = f"; {len(parts) - SHOWN} more reasons" if len(parts) > SHOWN else ""
    return "; ".join(parts[:SHOWN]) + more


def filter_summary(record: dict[str, Any]) -> str:
    hosts, units = record["hosts"], record["units"]
    kept = record["result"] if isinstance(record["result"], list) else []
    head = f"kept {len(kept)} of {len(hosts)} hosts"
    clauses = [f"{u['unit']} dropped {len(u['dropped'])} ({_reason_text(u, u['dropped'])})"
               for u in units if u["ok"] and u["dropped"]]
    clauses += _failed_clauses(units) + _missing_facts_clauses(record)
    return head + (": " + "; ".join(clauses) if clauses else "") + _fallback_tail(record)


def score_summary(record: dict[str, Any]) -> str:
    result = record["result"] if isinstance(record["result"], list) else []
    ranked = sorted(result, key=lambda pair: pair[1])  # the engine's weights: lower is better
    head = (f"best {ranked[0][0]} (weight {ranked[0][1]}, lowest) of {len(result)} scored hosts" if ranked
            else "no host scored")
    ok = [u for u in record["units"] if u["ok"]]
    clauses = [f"{len(ok)} of {len(record['units'])} units scored"] if record["units"] else []
    scored = {pair[0] for pair in result}
    unscored = [h for h in record["hosts"] if h not in scored]
    if unscored and result:
        clauses.append(f"no score for {_short(unscored)}")
    best = ranked[0][0] if ranked else None
    clauses += [f"{u['unit']} on {best}: {u['reasons'][best]}" for u in ok if best in u.get("reasons", {})][:SHOWN]
    clauses += _failed_clauses(record["units"]) + _missing_facts_clauses(record)
    return head + (": " + "; ".join(clauses) if clauses else "") + _fallback_tail(record)


def balance_summary(record: dict[str, Any]) -> str:
    result = record["result"]
    vm, hosts = (result[0], result[1]) if isinstance(result, list) and len(result) == 2 else ("", [])
    name = record["units"][0]["unit"] if record["units"] else record.get("unit", "the balancer")
    head = (f"{name} proposes migrating VM {vm} to one of {len(hosts)} hosts ({_short(hosts)})" if vm
            else f"{name}: no migration")
    clauses = [u["reason"] for u in record["units"] if u["ok"] and u.get("reason")]
    clauses += _failed_clauses(record["units"]) + _missing_facts_clauses(record)
    return head + (": " + "; ".join(clauses) if clauses else "") + _fallback_tail(record)


def _missing_facts_clauses(record: dict[str, Any]) -> list[str]:
    """``no facts for 3 of 5 hosts (no agent reports them) for vmsched_Memory``: the hosts the units that read
    facts found none for, how many and why (grouped by why)."""
    missing = record.get("missing_facts") or {}
    causes: dict[str, list[str]] = missing.get("hosts") or {}
    count = sum(len(hosts) for hosts in causes.values())
    if not count:
        return []
    why = "; ".join(f"{len(hosts)}: {cause}" if len(causes) > 1 else cause for cause, hosts in causes.items())
    return [f"no facts for {count} of {len(record['hosts'])} hosts ({why}) for {', '.join(missing.get('units', []))}"]


def _fallback_tail(record: dict[str, Any]) -> str:
    if not record["fallback"]:
        return ""
    why = "; ".join(record["errors"][:2]) or "nothing ran"
    return f" [fallback: {why}]"


SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "filter": filter_summary, "score": score_summary, "balance": balance_summary}


# --- the ring ---------------------------------------------------------------------------------------------------

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
    """The newest ``size`` decisions of each operation, each one bytes object (:meth:`Kept.dumps`), and an index
    by ID. Thread-safe: the event loop writes and reads, the output thread and the link to the other replicas
    read."""

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
            return Kept.loads(data).record(record_id, at, self.gateway)
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


# --- the log: the ring, the stdout lines and the other replicas --------------------------------------------------

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
    def submit(self, op: str, req: Any, decision: Any, outcomes: Any, bus_failed: bool, duration: float) -> None:
        """Keep the decision in the ring, as one bytes object (the request's objects die with it)."""
        try:
            data = keep(op, req, decision, outcomes, bus_failed, duration, self._ages(req.hosts)).dumps()
        except Exception:  # noqa: BLE001 - the log must never fail a scheduling request
            log.exception("keeping a %s decision failed", op)
            self.skipped += 1
            return
        record_id, at = new_id(), time.time()
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
    async def search(self, limit: int = 100, **filters: Any) -> Found:
        """The newest ``limit`` records matching ``filters`` of every replica that answers in time."""
        own = self.ring.recent(limit, **filters)
        if self.peers is None:
            return Found(own)
        gathered = await self.peers.ask({"filters": _filters(filters), "limit": limit})
        merged: dict[str, dict[str, Any]] = {r["id"]: r for r in gathered.records if matches(r, **filters)}
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


def _found(records: list[dict[str, Any]], gathered: Gathered) -> Found:
    return Found(records, gathered.answered, gathered.missing, gathered.truncated)
