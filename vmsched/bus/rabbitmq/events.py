"""Publishing events on the ``vmsched.events`` topic exchange of RabbitMQ (``Transport.events``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kombu import Connection, Producer

from vmsched.bus.rabbitmq.connection import CONNECTION_ERRORS, ensure_exchanges, note_lost, open_connection, safe_release
from vmsched.bus.options import BusOptions
from vmsched.bus.interface import event_bytes
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.bus.options import mask

log = logging.getLogger("vmsched.bus")


class EventPublisher:
    """Best-effort event publisher, safe to call from several threads.

    Events are notifications, not commands: when the broker is down an event
    is logged and dropped (never raised to the caller), and the publisher
    reconnects on a later publish after a short cool-down. A connection that
    broke since the last event (its node died) is replaced at once, to another
    node of a cluster first, and the event sent there.
    """

    def __init__(self, url: str | BusOptions, service: str = "agent", retry_after: float = 2.0) -> None:
        self.options = url if isinstance(url, BusOptions) else BusOptions(url=url, connect_timeout=1.0)
        self.service = service
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._producer: Producer | None = None
        self._down_since = 0.0

    def publish(self, routing_key: str, body: dict[str, Any]) -> bool:
        payload = event_bytes(self.service, body)
        with self._lock:
            for again in (False, True):
                stale = self._producer is not None  # opened for an earlier event
                try:
                    producer = self._ensure(now=again)
                    if producer is None:
                        return False
                    producer.publish(payload, routing_key=routing_key, exchange=EVENTS_EXCHANGE,
                                     content_type="application/json", content_encoding="utf-8", retry=False)
                    return True
                except CONNECTION_ERRORS as exc:
                    note_lost(self._conn)
                    self._reset()
                    if stale and not again:
                        continue
                    log.warning("%s: event %s dropped, bus unavailable: %s", self.service, routing_key, mask(str(exc)))
            return False

    def _ensure(self, now: bool = False) -> Producer | None:
        if self._producer is not None:
            return self._producer
        if not now and self._down_since and time.monotonic() - self._down_since < self.retry_after:
            return None
        try:
            self._conn = open_connection(self.options)
            ensure_exchanges(self._conn, (EVENTS_EXCHANGE,))
            self._producer = Producer(self._conn.default_channel, auto_declare=False)
            self._down_since = 0.0
            return self._producer
        except CONNECTION_ERRORS as exc:
            log.warning("%s: cannot reach the bus for events: %s", self.service, mask(str(exc)))
            self._reset()
            return None

    def _reset(self) -> None:
        safe_release(self._conn)
        self._conn = self._producer = None
        self._down_since = time.monotonic()

    def close(self) -> None:
        with self._lock:
            safe_release(self._conn)
            self._conn = self._producer = None
