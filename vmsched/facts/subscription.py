"""Host facts on the bus: a service's subscription and an agent's snapshot listener.

- :class:`FactsSubscriber` (scoring, balancer, gateway): every replica has
  its own exclusive queue bound to ``vmsched.events`` with the key
  ``agent.*.facts``, so each replica sees every host. After each (re)connect
  it publishes a :class:`~vmsched.facts.SnapshotRequest` on ``vmsched.facts``,
  and every agent answers by publishing its full facts at once.
- :class:`SnapshotListener` (agent): its own exclusive queue bound to
  ``vmsched.facts`` with the key ``snapshot``; calls back for each request.

The subscriber takes messages in batches: after a message wakes it, it waits
:data:`LINGER` seconds and then takes everything that arrived meanwhile: with
many agents, one wake-up per batch costs its thread about half the CPU of one
wake-up per message. Facts reach the cache at most that much later.

Both are subscriptions of the process's transport (:mod:`vmsched.bus.interface`) and best effort:
a broker outage is logged and retried with backoff, never raised to the caller. Messages are handed over as raw bytes: the
reader (:func:`vmsched.facts.read`) decides what it accepts.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Callable

from vmsched.bus.interface import Publish, Subscription, Topic, Transport
from vmsched.bus.topology import EVENTS_EXCHANGE, FACTS_EXCHANGE
from vmsched.facts.model import FACTS_EVENT, SnapshotRequest

log = logging.getLogger("vmsched.facts.subscription")

SNAPSHOT_KEY = "snapshot"
#: Seconds the subscriber waits after a message for the others arriving meanwhile (one wake-up per batch).
LINGER = 0.25
FACTS_BINDING = f"agent.*.{FACTS_EVENT}"


class _Listener:
    """A subscription of the process's transport (``subscription``), started and stopped with its owner."""

    subscription: Subscription

    def start(self) -> None:
        self.subscription.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.subscription.stop(timeout)


class FactsSubscriber(_Listener):
    """Hands every facts message on the bus to ``on_message(raw bytes, routing key)``; asks for a snapshot on connect.

    The routing key matters: broker permissions let an agent publish only under its own host's key, so the
    reader checks that the message's host is the key's host (an agent cannot speak for another host)."""

    def __init__(self, transport: Transport, service: str, on_message: Callable[[bytes, str], object]) -> None:
        self.service = service
        self.queue_name = f"vmsched.facts.{service}.{secrets.token_hex(6)}"
        topic = Topic(self.queue_name, EVENTS_EXCHANGE, (FACTS_BINDING,), 100000, also=(FACTS_EXCHANGE,))
        self.subscription = transport.subscribe(f"{service}-facts", topic, on_message,
                                                on_subscribed=self._ask_snapshot, linger=LINGER)
        self.ready = self.subscription.ready

    def _ask_snapshot(self, publish: Publish) -> None:
        publish(FACTS_EXCHANGE, SNAPSHOT_KEY, SnapshotRequest(requester=self.service).model_dump_json().encode())
        log.info("%s: subscribed to host facts (queue %s); asked the agents for a snapshot", self.service,
                 self.queue_name)


class SnapshotListener(_Listener):
    """An agent's queue of snapshot requests: calls ``on_request()`` for each."""

    def __init__(self, transport: Transport, host_id: str, on_request: Callable[[], None]) -> None:
        self.on_request = on_request
        self.queue_name = f"vmsched.facts.snapshot.{host_id}"
        self.subscription = transport.subscribe("agent-facts-snapshot",
                                                Topic(self.queue_name, FACTS_EXCHANGE, (SNAPSHOT_KEY,), 100),
                                                self._received)
        self.ready = self.subscription.ready

    def _received(self, body: bytes, routing_key: str) -> None:
        try:
            json.loads(body)  # anything parseable is a request; the content is informative only
        except (ValueError, TypeError):
            log.warning("facts snapshot request is not JSON: ignored")
            return
        self.on_request()
