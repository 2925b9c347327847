"""The gateway's decision log: a bounded ring per operation, filled off the request path.

:meth:`DecisionLog.submit` is all the request path pays: it keeps the raw
parts of a decision (request, outcomes, decision). Every :data:`PAUSE`
seconds the event loop, between requests and in one go, builds the waiting
records (:mod:`vmsched.gateway.decisions`) and adds them to the ring: no
thread hand-off per record (each one cost the loop a GIL switch). An output
thread, only when there is output, writes them as JSON lines to stdout
(``--decisions-log``) and publishes them, batched, on ``vmsched.events`` with
the routing key ``gateway.<id>.decision``. :class:`DecisionSubscriber` reads
that key from every gateway, so with several replicas each ring holds all
their decisions; a gateway skips its own (already in its ring). On the
embedded bus (``memory://``: one process, so one gateway) nothing is
published.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import re
import secrets
import socket
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

from kombu import Connection, Consumer, Queue
from kombu.message import Message

from vmsched.bus.connection import BusOptions, ensure_exchanges
from vmsched.bus.events import EventPublisher
from vmsched.bus.loop import ConsumerLoop, hand_over
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.facts_cache import FactsCache
from vmsched.gateway import decisions

log = logging.getLogger("vmsched.gateway.decisions")

OPS = ("filter", "score", "balance")
DECISION_BINDING = "gateway.*.decision"
#: records in one published message at most
BATCH = 200
#: how long a decision waits for its batch to be recorded, seconds
PAUSE = 0.2
MAX_MESSAGE = 8 << 20
#: decisions waiting for the recording thread at most; past it new ones are counted in ``skipped``, not kept
MAX_PENDING = 5000


def gateway_label(configured: str = "") -> str:
    """A routing-key-safe label of this gateway: the setting, else the host name."""
    label = re.sub(r"[^A-Za-z0-9_-]", "-", configured or socket.gethostname())[:64]
    return label or "gateway"


class Entry:
    """One decision in the ring: its record, or the decision's parts, built into the record when first read."""

    __slots__ = ("id", "op", "time", "_record", "_parts")

    def __init__(self, record_id: str, op: str, at: float, record: dict[str, Any] | None = None,
                 parts: dict[str, Any] | None = None) -> None:
        self.id, self.op, self.time = record_id, op, at
        self._record, self._parts = record, parts

    def record(self) -> dict[str, Any] | None:
        if self._record is None and self._parts is not None:
            with _BUILDING:  # the loop (API, console) and the output thread may both ask
                if self._record is None and self._parts is not None:
                    try:
                        self._record = decisions.build(**self._parts)
                    except Exception:  # noqa: BLE001 - the log must never take the gateway down
                        log.exception("recording a %s decision failed", self.op)
                    self._parts = None
        return self._record


_BUILDING = threading.Lock()


class Ring:
    """The newest ``size`` decisions of each operation, and an index by ID; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._rings: dict[str, deque[Entry]] = {op: deque() for op in OPS}
        self._by_id: dict[str, Entry] = {}

    def add(self, record: dict[str, Any]) -> None:
        """A built record (another gateway's, or a test's)."""
        if isinstance(record.get("id"), str) and isinstance(record.get("time"), (int, float)):
            self.add_entry(Entry(record["id"], record.get("op", ""), record["time"], record=record))

    def add_entry(self, entry: Entry) -> None:
        ring = self._rings.get(entry.op)
        if ring is None:
            return
        with self._lock:
            if entry.id in self._by_id:
                return
            ring.append(entry)
            self._by_id[entry.id] = entry
            while len(ring) > self.size:
                self._by_id.pop(ring.popleft().id, None)

    def get(self, record_id: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._by_id.get(record_id)
        return entry.record() if entry is not None else None

    def recent(self, limit: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Newest first, across operations, matching :func:`decisions.matches`."""
        with self._lock:
            entries = [e for ring in self._rings.values() for e in ring]
        entries.sort(key=lambda e: e.time, reverse=True)
        found = []
        for entry in entries:
            record = entry.record()
            if record is not None and decisions.matches(record, **filters):
                found.append(record)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)


class DecisionLog:
    """Owns the ring, the batching of records and, with a bus or stdout, the output thread, publisher and subscriber."""

    def __init__(self, size: int, gateway: str, facts: FactsCache | None = None,
                 bus: BusOptions | None = None, stdout: bool = False) -> None:
        self.ring = Ring(size)
        self.gateway = gateway
        self.facts = facts
        self.stdout = stdout
        self.skipped = 0  # decisions not recorded because MAX_PENDING were waiting
        self._pending: deque[tuple[Any, ...]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._out: queue.SimpleQueue[list[Entry] | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if not size or (bus is not None and bus.url.startswith("memory://")):
            bus = None  # size 0: no decision log at all; the embedded bus: no other gateway to share with
        self.publisher = EventPublisher(bus, service=f"gateway-{gateway}") if bus is not None else None
        self.subscriber = DecisionSubscriber(bus, gateway, self._received) if bus is not None else None

    # --- the request path -------------------------------------------------------------------------
    def submit(self, op: str, req: Any, decision: Any, outcomes: Any, bus_failed: bool, duration: float) -> None:
        """Keep the decision's parts; on the event loop, its record is built with the others every PAUSE s."""
        if len(self._pending) >= MAX_PENDING:  # never let the backlog grow unbounded
            self.skipped += 1
            return
        self._pending.append((op, req, decision, outcomes, bus_failed, duration, time.time()))
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(PAUSE, self.record_pending)
            except RuntimeError:  # not on an event loop (tests, tools): record at once
                self.record_pending()

    # --- the batch ----------------------------------------------------------------------------------
    def record_pending(self) -> None:
        """Ring the waiting decisions (one go, on the caller's thread: no hand-off per decision); their records
        are built when first read, or by the output thread for stdout and the bus."""
        self._timer = None
        facts_known = self.facts is not None and bool(self.facts.hosts())
        batch = []
        while self._pending:
            op, req, decision, outcomes, bus_failed, duration, at = self._pending.popleft()
            record_id = decisions.new_id()
            parts = {"op": op, "req": req, "decision": decision, "outcomes": _without_stderr(outcomes),
                     "bus_failed": bus_failed, "gateway": self.gateway, "duration": duration, "at": at,
                     "facts_age": self._ages(req) if facts_known else {}, "record_id": record_id}
            entry = Entry(record_id, op, at, parts=parts)
            self.ring.add_entry(entry)
            batch.append(entry)
        if batch and self._thread is not None:
            for start in range(0, len(batch), BATCH):
                self._out.put(batch[start:start + BATCH])

    # --- the output thread ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.stdout or self.publisher is not None:
            self._thread = threading.Thread(target=self._output, name="gateway-decisions", daemon=True)
            self._thread.start()
        if self.subscriber is not None:
            self.subscriber.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.record_pending()
        self._out.put(None)
        if self._thread is not None:
            self._thread.join(5)
        if self.subscriber is not None:
            self.subscriber.stop()
        if self.publisher is not None:
            self.publisher.close()

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
            item = [r for e in entries if (r := e.record()) is not None]
            if self.stdout:
                sys.stdout.write("".join(json.dumps({"event": "vmsched.decision", **r}, default=str) + "\n"
                                         for r in item))
                sys.stdout.flush()
            if self.publisher is not None:
                self.publisher.publish(f"gateway.{self.gateway}.decision", {"decisions": item})

    def _ages(self, req: Any) -> dict[str, float]:
        """Seconds since each host's facts were collected; a host without facts is left out."""
        if self.facts is None:
            return {}
        now = time.time()
        ages: dict[str, float] = {}
        for host in getattr(req, "hosts", []):
            entry, _ = self.facts.resolve(host)
            if entry is not None:
                ages[host] = round(self.facts.age(entry, now), 3)
        return ages

    def _received(self, body: bytes, routing_key: str) -> None:
        parts = routing_key.split(".")
        if len(parts) != 3 or parts[1] == self.gateway or len(body) > MAX_MESSAGE:
            return  # our own (already in the ring: not even parsed), or not a decision message
        try:
            message = json.loads(body)
        except ValueError:
            log.warning("decision message on %s is not JSON: ignored", routing_key)
            return
        for record in message.get("decisions", []) if isinstance(message, dict) else []:
            if isinstance(record, dict) and record.get("gateway") == parts[1] and _well_formed(record):
                self.ring.add(record)


def _without_stderr(outcomes: Any) -> Any:
    """The outcomes as the record needs them: a unit's stderr (up to --max-output) is not kept while waiting."""
    if isinstance(outcomes, list):
        return [o.model_copy(update={"stderr": ""}) if o.stderr else o for o in outcomes]
    return outcomes.model_copy(update={"stderr": ""}) if outcomes is not None and outcomes.stderr else outcomes


def _well_formed(record: dict[str, Any]) -> bool:
    return (isinstance(record.get("time"), (int, float)) and isinstance(record.get("hosts"), list)
            and isinstance(record.get("units"), list) and isinstance(record.get("summary"), str)
            and isinstance(record.get("vm"), str) and all(isinstance(u, dict) for u in record["units"]))


class DecisionSubscriber(ConsumerLoop):
    """Every gateway's decisions: an exclusive queue ``vmsched.decisions.gateway.<random>`` on ``gateway.*.decision``."""

    def __init__(self, options: BusOptions, gateway: str, on_message: Callable[[bytes, str], None]) -> None:
        super().__init__(options, "gateway-decisions-sub")
        self.on_message = on_message
        self.queue_name = f"vmsched.decisions.gateway.{secrets.token_hex(6)}"

    def _serve(self, conn: Connection) -> None:
        ensure_exchanges(conn, (EVENTS_EXCHANGE,))
        queue_ = Queue(self.queue_name, exchange=EVENTS_EXCHANGE, routing_key=DECISION_BINDING, exclusive=True,
                       auto_delete=True, durable=False, queue_arguments={"x-max-length": 10000})
        Consumer(conn.channel(), [queue_], on_message=self._received, no_ack=True).consume()
        self._drain(conn)

    def _received(self, message: Message) -> None:
        hand_over(message, self.on_message, "decision")
