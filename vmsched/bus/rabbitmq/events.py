"""Publishing events on the ``vmsched.events`` topic exchange of RabbitMQ (``Transport.events``)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import suppress
from typing import Any

from amqp.exceptions import MessageNacked
from kombu import Connection, Producer

from vmsched.bus.rabbitmq.connection import (
    CONNECTION_ERRORS,
    drop,
    ensure_exchanges,
    note_lost,
    open_connection,
    safe_release,
)
from vmsched.bus.options import BusOptions, mask
from vmsched.bus.interface import event_bytes
from vmsched.bus.topology import EVENTS_EXCHANGE

log = logging.getLogger("vmsched.bus")

#: Seconds after a failure before a publish tries to connect again (an event meanwhile is dropped).
RETRY_AFTER = 2.0
#: Frames read at most per heartbeat round (an event connection gets heartbeats and, rarely, a closing).
_MAX_FRAMES = 100


class EventPublisher:
    """Best-effort event publisher, safe to call from several threads.

    Events are notifications, not commands: when the broker is down an event
    is logged and dropped (never raised to the caller), and the publisher
    reconnects on a later publish after a short cool-down. A connection that
    broke since the last event (its node died) is replaced at once, to another
    node of a cluster first, and the event sent there.

    With ``confirm``, an event counts as sent only once the broker confirmed
    it (within the confirm timeout): one written into a connection the broker
    had closed, or refused, is sent again on a new connection, else reported
    as dropped. Without, it is sent and not awaited.

    Between events the connection is kept alive by a thread of the publisher:
    about every second (at most every quarter of the heartbeat) it reads what
    the broker sent (its heartbeats, a closing) and sends a heartbeat when one
    is due, through kombu's ``Connection.heartbeat_check``; an idle connection
    is not closed for missed heartbeats, and one the broker closed or stopped
    answering on is dropped at once (the next event opens another).
    """

    def __init__(self, url: str | BusOptions, service: str = "agent", confirm: bool = False) -> None:
        self.options = url if isinstance(url, BusOptions) else BusOptions(url=url, connect_timeout=1.0)
        self.service = service
        self.confirm = confirm
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._producer: Producer | None = None
        self._down_since = 0.0
        self._beat_every = min(1.0, max(0.1, self.options.heartbeat / 4))
        self._beating: threading.Event | None = None  # set: the heartbeat thread stops

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
                                     content_type="application/json", content_encoding="utf-8", retry=False,
                                     **({"confirm_timeout": self.options.confirm_timeout} if self.confirm else {}))
                    return True
                except (*CONNECTION_ERRORS, MessageNacked) as exc:
                    note_lost(self._conn)
                    self._reset()
                    if stale and not again:
                        continue
                    log.warning("%s: event %s dropped, bus unavailable: %s", self.service, routing_key,
                                mask(str(exc)) or type(exc).__name__)
            return False

    def _ensure(self, now: bool = False) -> Producer | None:
        if self._producer is not None:
            return self._producer
        if not now and self._down_since and time.monotonic() - self._down_since < RETRY_AFTER:
            return None
        try:
            self._conn = open_connection(self.options, blocking_confirms=self.confirm)
            ensure_exchanges(self._conn, (EVENTS_EXCHANGE,))
            self._producer = Producer(self._conn.default_channel, auto_declare=False)
            self._down_since = 0.0
            if self.options.heartbeat and self._beating is None:  # the heartbeat thread lasts until close()
                self._beating = threading.Event()
                threading.Thread(target=self._beat, args=(self._beating,), name=f"{self.service}-events-heartbeat",
                                 daemon=True).start()
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
            if self._beating is not None:
                self._beating.set()
                self._beating = None
            safe_release(self._conn)
            self._conn = self._producer = None

    # --- heartbeats between events ------------------------------------------
    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(self._beat_every):
            with self._lock:
                if self._conn is not None and not stop.is_set():
                    self._keep_alive(self._conn)

    def _keep_alive(self, conn: Connection) -> None:
        try:
            with suppress(socket.timeout):  # nothing more to read
                for _ in range(_MAX_FRAMES):
                    conn.drain_events(timeout=0)  # the broker's heartbeats, or its closing of the connection
            conn.heartbeat_check()  # ours when due; raises when the broker has been silent two intervals
        except CONNECTION_ERRORS as exc:
            note_lost(conn)
            log.warning("%s: event connection lost (%s); the next event opens another", self.service,
                        mask(str(exc)) or type(exc).__name__)
            drop(conn)
            self._conn = self._producer = None
