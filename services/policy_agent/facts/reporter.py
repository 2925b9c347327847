"""The facts reporter: collects host facts every interval and on lifecycle events, and publishes them.

Every message carries the host summary (with the CPU history and the
guest counts); the guest list only when it changed (:func:`guests_digest`),
on a snapshot request, or every ``guests_every`` intervals. Publishing is the
caller's (the agent bus's event queue: best effort, never blocking).
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from typing import Any, Callable

from vmsched import cpuset
from vmsched.facts.model import FACTS_EVENT, FactsMessage, GuestFacts, HostFacts

from .. import metrics
from ..policy.model import GuestPolicy
from .arithmetic import HISTORY_SECONDS, dedicated_summary, guests_digest, pinned

log = logging.getLogger("vmsched.agent.facts")

#: (dedicated pool, shared set, allocations uuid -> CPUs, guests' policies by UUID: defined guests' and stored ones)
Layout = tuple[frozenset[int], frozenset[int], dict[str, frozenset[int]], dict[str, GuestPolicy | None]]


class FactsReporter:
    def __init__(self, host_id: str, collector: Any, conn: Callable[[], Any], layout: Callable[[], Layout],
                 publish: Callable[[str, dict], None], interval: float = 5.0, guests_every: int = 12) -> None:
        self.host_id = host_id
        self.collector = collector
        self.conn = conn
        self.layout = layout
        self.publish = publish
        self.interval = interval
        self.guests_every = guests_every
        self.instance = secrets.token_hex(8)
        self.seq = 0
        #: the host's CPU use of the last HISTORY_SECONDS, one sample an interval
        self.history: collections.deque[float] = collections.deque(maxlen=max(1, int(HISTORY_SECONDS // interval)))
        self._digest = ""
        self._since_guests = 0
        self._wake = threading.Event()
        self._reasons: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="agent-facts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        self.collector.close()

    def trigger(self, reason: str = "event") -> None:
        """Collect and publish now (a lifecycle event, or a snapshot request: the full guest list)."""
        with self._lock:
            self._reasons.add(reason)
        self._wake.set()

    def _loop(self) -> None:
        next_due = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_due - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            with self._lock:
                reasons, self._reasons = self._reasons, set()
            now = time.monotonic()
            if now >= next_due:
                reasons.add("interval")
                next_due = max(next_due + self.interval, now)
            if not reasons:
                continue
            try:
                self.publish(FACTS_EVENT, self.collect(reasons).model_dump(mode="json"))
            except Exception as exc:  # noqa: BLE001 - libvirt down, ...: the next round retries
                metrics.ERRORS.labels("facts").inc()
                log.warning("collecting host facts failed: %s", exc)

    def collect(self, reasons: set[str] | frozenset[str] = frozenset({"interval"})) -> FactsMessage:
        """One collection: the message to publish."""
        started = time.process_time()
        conn = self.conn()
        host = self.collector.host(conn)
        pool, shared, allocations, policies = self.layout()
        guests = self._annotate(self.collector.guests(conn), allocations, policies)
        if "interval" in reasons:
            self.history.append(round(host.cpu_pct, 1))
        running = [g for g in guests if g.state in ("running", "blocked")]
        host = host.model_copy(update={
            "dedicated_pool": cpuset.fmt(pool), "shared_cpus": cpuset.fmt(shared),
            "allocations": {u: cpuset.fmt(c) for u, c in allocations.items()},
            **dedicated_summary(pool, allocations, policies, self.collector.topology),
            "guests_running": len(running), "guests_total": len(guests),
            "guest_memory_mib": sum(g.memory_mib for g in running), "guest_vcpus": sum(g.vcpus for g in running),
            "history_interval": self.interval, "cpu_history": list(self.history),
        })
        digest = guests_digest(guests)
        self._since_guests += 1
        send = "snapshot" in reasons or digest != self._digest or self._since_guests >= self.guests_every
        if send:
            self._digest, self._since_guests = digest, 0
        self.seq += 1
        reason = "snapshot" if "snapshot" in reasons else "event" if "event" in reasons else "interval"
        message = FactsMessage(host_id=self.host_id, instance=self.instance, seq=self.seq, time=time.time(),
                               interval=self.interval, reason=reason, host=HostFacts.model_validate(host),
                               guests=guests if send else None, guests_digest=digest)
        metrics.FACTS_COLLECT_CPU.observe(time.process_time() - started)
        metrics.observe_host(message.host)  # this host's gauges: the agent is their one exporter
        return message

    def _annotate(self, guests: list[GuestFacts], allocations: dict[str, frozenset[int]],
                  policies: dict[str, GuestPolicy | None]) -> list[GuestFacts]:
        running = {g.uuid for g in guests}
        policies = {u: p for u, p in policies.items() if u in running}  # stored ones of absent guests: host-level
        return [g.model_copy(update={"has_policy": g.uuid in policies, "dedicated": bool(allocations.get(g.uuid)),
                                     "dedicated_cpus": len(allocations.get(g.uuid, ())),
                                     "pinned": pinned(policies.get(g.uuid))})
                if g.uuid in policies or g.uuid in allocations else g for g in guests]
