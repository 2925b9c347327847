"""Console logouts shared by the gateway replicas over the bus (RabbitMQ; the embedded bus has one gateway).

Each gateway binds its own exclusive queue ``vmsched.console.gateway.<token>``
to ``vmsched.events`` with two keys:

- ``gateway.console.logout``: logged-out sessions, ``{"logouts": [[session ID,
  expiry], ...]}``; every replica adds them to its list
  (:class:`~vmsched.gateway.console.sessions.Logouts`);
- ``gateway.console.hello``: a gateway that (re)subscribes shares its own list
  and asks for theirs; every other replica answers with its whole list under
  the logout key, so a new or reconnected replica learns the logouts it missed,
  and the others those it could not share while the bus was away.

A logout message can only end sessions, never make one. The lists live in the
replicas' memory: when every replica stops at once, the logouts are forgotten
and those sessions are accepted again until they expire (a new console secret
ends every session).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from vmsched.bus.interface import Publish, Topic, Transport
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.gateway import replica_messages
from vmsched.gateway.console.sessions import Logouts

log = logging.getLogger("vmsched.gateway.console")

LOGOUT_KEY = "gateway.console.logout"
HELLO_KEY = "gateway.console.hello"
#: logouts in one message at most (a hello's answer is sent in as many as needed)
CHUNK = 2000
MAX_MESSAGE = 1 << 20


class LogoutLink:
    """One gateway's side of the shared logout list: a subscription of the process's transport (its own thread
    and, on RabbitMQ, its own connection, reconnecting with backoff)."""

    def __init__(self, transport: Transport, gateway: str, logouts: Logouts) -> None:
        self.gateway = gateway
        self.logouts = logouts
        self.token = replica_messages.new_token()
        self.queue_name = f"vmsched.console.gateway.{self.token}"
        self.publisher = transport.events(f"gateway-{gateway}")
        topic = Topic(self.queue_name, EVENTS_EXCHANGE, (LOGOUT_KEY, HELLO_KEY), 1000)
        self.subscription = transport.subscribe("gateway-console-logouts", topic, self._handle,
                                                on_subscribed=self._subscribed)
        self.ready = self.subscription.ready  # subscribed at least once

    def share(self, entries: list[tuple[str, int]]) -> bool:
        """Tell the other replicas (blocking: call it off the event loop); False when the bus is unavailable."""
        ok = True
        for start in range(0, len(entries), CHUNK):
            body = {"token": self.token, "gateway": self.gateway, "logouts": entries[start:start + CHUNK]}
            ok = self.publisher.publish(LOGOUT_KEY, body) and ok
        return ok

    def start(self) -> None:
        self.subscription.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.subscription.stop(timeout)
        self.publisher.close()

    def _subscribed(self, publish: Publish) -> None:
        """After each (re)subscription: our list to the others, and a hello that asks for theirs."""
        self.share(self.logouts.entries())
        self.publisher.publish(HELLO_KEY, {"token": self.token, "gateway": self.gateway})

    def _handle(self, body: bytes, routing_key: str) -> None:
        message = replica_messages.read(body, routing_key, MAX_MESSAGE, log, "console logouts")
        if message is None or not replica_messages.from_another(message.get("token"), self.token):
            return  # our own, or not well formed
        if routing_key == HELLO_KEY:
            self.share(self.logouts.entries())
        elif routing_key == LOGOUT_KEY:
            self._add(message.get("logouts"))

    def _add(self, entries: Any) -> None:
        if not isinstance(entries, list):
            return
        now = time.time()
        for entry in entries[:CHUNK]:
            if isinstance(entry, list) and len(entry) == 2:
                self.logouts.add(entry[0], entry[1], now)
