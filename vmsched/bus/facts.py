"""Host facts on the bus: a service's subscription and an agent's snapshot listener.

- :class:`FactsSubscriber` (scoring, balancer, gateway): every replica has
  its own exclusive queue bound to ``vmsched.events`` with the key
  ``agent.*.facts``, so each replica sees every host. After each (re)connect
  it publishes a :class:`~vmsched.facts.SnapshotRequest` on ``vmsched.facts``,
  and every agent answers by publishing its full facts at once.
- :class:`SnapshotListener` (agent): its own exclusive queue bound to
  ``vmsched.facts`` with the key ``snapshot``; calls back for each request.

The subscriber takes messages in batches: after a message wakes it, it waits
:data:`LINGER` seconds and then takes everything that arrived meanwhile. With
100 agents every 5 s (20 messages a second, one at a time) a wake-up per
message cost its thread about 370 µs of CPU per message, a wake-up per
batch about 170-200 µs (docs/performance.md, "Host facts"); facts reach the
cache at most that much later.

Both are best effort: a broker outage is logged and retried with backoff,
never raised to the caller. Messages are handed over as raw bytes: the
reader (:func:`vmsched.facts.read`) decides what it accepts.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Callable

from kombu import Connection, Consumer, Producer, Queue
from kombu.message import Message

from vmsched.bus.connection import BusOptions, ensure_exchanges
from vmsched.bus.topology import EVENTS_EXCHANGE, FACTS_EXCHANGE
from vmsched.bus.loop import ConsumerLoop, hand_over
from vmsched.facts import FACTS_EVENT, SnapshotRequest

log = logging.getLogger("vmsched.bus.facts")

SNAPSHOT_KEY = "snapshot"
#: Seconds the subscriber waits after a message for the others arriving meanwhile (one wake-up per batch).
LINGER = 0.25
FACTS_BINDING = f"agent.*.{FACTS_EVENT}"


class FactsSubscriber(ConsumerLoop):
    """Hands every facts message on the bus to ``on_message(raw bytes, routing key)``; asks for a snapshot on connect.

    The routing key matters: broker permissions let an agent publish only under its own host's key, so the
    reader checks that the message's host is the key's host (an agent cannot speak for another host)."""

    def __init__(self, options: BusOptions, service: str, on_message: Callable[[bytes, str], object]) -> None:
        super().__init__(options, f"{service}-facts")
        self.service = service
        self.on_message = on_message
        self.queue_name = f"vmsched.facts.{service}.{secrets.token_hex(6)}"
        self.linger = LINGER

    def _serve(self, conn: Connection) -> None:
        ensure_exchanges(conn, (EVENTS_EXCHANGE, FACTS_EXCHANGE))
        channel = conn.channel()
        queue = Queue(self.queue_name, exchange=EVENTS_EXCHANGE, routing_key=FACTS_BINDING, exclusive=True,
                      auto_delete=True, durable=False, queue_arguments={"x-max-length": 100000})
        Consumer(channel, [queue], on_message=self._received, no_ack=True).consume()
        request = SnapshotRequest(requester=self.service).model_dump_json().encode()
        Producer(channel, auto_declare=False).publish(request, exchange=FACTS_EXCHANGE, routing_key=SNAPSHOT_KEY,
                                                      content_type="application/json", retry=False)
        log.info("%s: subscribed to host facts (queue %s); asked the agents for a snapshot", self.service,
                 self.queue_name)
        self._drain(conn)

    def _received(self, message: Message) -> None:
        hand_over(message, self.on_message, f"{self.service} facts")


class SnapshotListener(ConsumerLoop):
    """An agent's queue of snapshot requests: calls ``on_request()`` for each."""

    def __init__(self, options: BusOptions, host_id: str, on_request: Callable[[], None]) -> None:
        super().__init__(options, "agent-facts-snapshot")
        self.on_request = on_request
        self.queue_name = f"vmsched.facts.snapshot.{host_id}"

    def _serve(self, conn: Connection) -> None:
        ensure_exchanges(conn, (FACTS_EXCHANGE,))
        channel = conn.channel()
        queue = Queue(self.queue_name, exchange=FACTS_EXCHANGE, routing_key=SNAPSHOT_KEY, exclusive=True,
                      auto_delete=True, durable=False, queue_arguments={"x-max-length": 100})
        Consumer(channel, [queue], on_message=self._received, no_ack=True).consume()
        self._drain(conn)

    def _received(self, message: Message) -> None:
        try:
            json.loads(message.body)  # anything parseable is a request; the content is informative only
        except (ValueError, TypeError):
            log.warning("facts snapshot request is not JSON: ignored")
            return
        self.on_request()
