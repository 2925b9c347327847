"""The gateway's decision log: a bounded ring per operation, filled off the request path.

:meth:`DecisionLog.submit` is all the request path pays: it puts the raw
parts of a decision (request, outcomes, decision) on a queue. One background
thread builds the record (:mod:`vmsched.gateway.decisions`), adds it to the
ring, writes it as one JSON line to stdout when asked (``--decisions-log``),
and publishes it, batched, on ``vmsched.events`` with the routing key
``gateway.<id>.decision``. :class:`DecisionSubscriber` reads that key from
every gateway, so with several replicas each ring holds all their decisions;
a gateway skips its own (already in its ring). On the embedded bus
(``memory://``, one process, so one gateway) nothing is published.

The recording thread wakes at most every :data:`PAUSE` seconds, builds the
records of the batch one by one and yields the GIL between them, so the
event loop answering the engine waits for at most one record's work.
"""

from __future__ import annotations

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
#: how long the recording thread waits after the first decision of a batch, seconds
PAUSE = 0.2
MAX_MESSAGE = 8 << 20
#: decisions waiting for the recording thread at most; past it new ones are counted in ``skipped``, not kept
MAX_PENDING = 5000


def gateway_label(configured: str = "") -> str:
    """A routing-key-safe label of this gateway: the setting, else the host name."""
    label = re.sub(r"[^A-Za-z0-9_-]", "-", configured or socket.gethostname())[:64]
    return label or "gateway"


class Ring:
    """The newest ``size`` records of each operation, and an index by ID; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._rings: dict[str, deque[dict[str, Any]]] = {op: deque() for op in OPS}
        self._by_id: dict[str, dict[str, Any]] = {}

    def add(self, record: dict[str, Any]) -> None:
        ring = self._rings.get(record.get("op", ""))
        if ring is None or not isinstance(record.get("id"), str):
            return
        with self._lock:
            if record["id"] in self._by_id:
                return
            ring.append(record)
            self._by_id[record["id"]] = record
            while len(ring) > self.size:
                self._by_id.pop(ring.popleft()["id"], None)

    def get(self, record_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._by_id.get(record_id)

    def recent(self, limit: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Newest first, across operations, matching :func:`decisions.matches`."""
        with self._lock:
            records = [r for ring in self._rings.values() for r in ring]
        records.sort(key=lambda r: r["time"], reverse=True)
        found = [r for r in records if decisions.matches(r, **filters)]
        return found[:limit] if limit is not None else found

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)


class DecisionLog:
    """Owns the ring, the recording thread and, with a bus, the publisher and the subscriber."""

    def __init__(self, size: int, gateway: str, facts: FactsCache | None = None,
                 bus: BusOptions | None = None, stdout: bool = False) -> None:
        self.ring = Ring(size)
        self.gateway = gateway
        self.facts = facts
        self.stdout = stdout
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.skipped = 0  # decisions not recorded because MAX_PENDING were waiting
        if not size or (bus is not None and bus.url.startswith("memory://")):
            bus = None  # size 0: no decision log at all; the embedded bus: no other gateway to share with
        self.publisher = EventPublisher(bus, service=f"gateway-{gateway}") if bus is not None else None
        self.subscriber = DecisionSubscriber(bus, gateway, self._received) if bus is not None else None

    # --- the request path -------------------------------------------------------------------------
    def submit(self, op: str, req: Any, decision: Any, outcomes: Any, bus_failed: bool, duration: float) -> None:
        if self._queue.qsize() >= MAX_PENDING:  # the recorder is starved: never let the backlog grow unbounded
            self.skipped += 1
            return
        self._queue.put((op, req, decision, outcomes, bus_failed, duration, time.time()))

    # --- the background ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gateway-decisions", daemon=True)
        self._thread.start()
        if self.subscriber is not None:
            self.subscriber.start()

    def stop(self) -> None:
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(5)
        if self.subscriber is not None:
            self.subscriber.stop()
        if self.publisher is not None:
            self.publisher.close()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything submitted so far is in the ring (tests, shutdown)."""
        done = threading.Event()
        self._queue.put((done,))
        done.wait(timeout)

    def _run(self) -> None:
        while True:
            batch: list[dict[str, Any]] = []
            item = self._queue.get()
            if item is not None and len(item) > 1:
                time.sleep(PAUSE)  # gather a batch: one wake-up per PAUSE, not per request (GIL hand-offs)
            facts_known = self.facts is not None and bool(self.facts.hosts())  # once per batch
            while True:
                if item is None:
                    self._publish(batch)
                    return
                if len(item) == 1:
                    item[0].set()
                else:
                    record = self._record(item, facts_known)
                    if record is not None:
                        batch.append(record)
                    time.sleep(0)  # hand the GIL back to the event loop between records
                if len(batch) >= BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            self._publish(batch)

    def _record(self, item: tuple[Any, ...], facts_known: bool) -> dict[str, Any] | None:
        op, req, decision, outcomes, bus_failed, duration, at = item
        try:
            ages = self._ages(req) if facts_known else {}
            record = decisions.build(op, req, decision, outcomes, bus_failed=bus_failed, gateway=self.gateway,
                                     duration=duration, facts_age=ages, at=at)
        except Exception:  # noqa: BLE001 - the log must never take the gateway down
            log.exception("recording a %s decision failed", op)
            return None
        self.ring.add(record)
        if self.stdout:
            sys.stdout.write(json.dumps({"event": "vmsched.decision", **record}, default=str) + "\n")
            sys.stdout.flush()
        return record

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

    def _publish(self, batch: list[dict[str, Any]]) -> None:
        if batch and self.publisher is not None:
            self.publisher.publish(f"gateway.{self.gateway}.decision", {"decisions": batch})

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
