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

A logout is published at once, confirmed by the broker. One that could not be
(the bus is down, or the connection was lost under it) waits in this
gateway: it goes out about a second after the subscription is up, or with the
whole list when the gateway subscribes again, on the subscription's own
connection (what is sent there while subscribing is sent again if that
connection is lost). So a logout made while the bus is away reaches the other
replicas as soon as both are subscribed again, a few seconds after the broker
returns.

A logout message can only end sessions, never make one. The lists live in the
replicas' memory: when every replica stops at once, the logouts are forgotten
and those sessions are accepted again until they expire (a new console secret
ends every session).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator

from vmsched.bus.interface import Publish, Topic, Transport, event_bytes
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
        self.service = f"gateway-{gateway}"
        self.publisher = transport.events(self.service, confirm=True)
        self._unshared: dict[str, int] = {}  # logouts not confirmed by the broker yet: session ID -> expiry
        self._lock = threading.Lock()
        self._here: Publish | None = None  # the subscription's own channel (its thread only)
        topic = Topic(self.queue_name, EVENTS_EXCHANGE, (LOGOUT_KEY, HELLO_KEY), 1000)
        self.subscription = transport.subscribe("gateway-console-logouts", topic, self._handle,
                                                on_subscribed=self._subscribed, tick=self._share_unshared)
        self.ready = self.subscription.ready  # subscribed at least once

    def share(self, entries: list[tuple[str, int]]) -> bool:
        """Tell the other replicas (blocking: call it off the event loop). False when the broker did not confirm
        it: the logouts then go out once this gateway's subscription is up (:meth:`_share_unshared`)."""
        ok = all([self.publisher.publish(LOGOUT_KEY, body) for body in self._bodies(entries)])
        if not ok:
            with self._lock:
                self._unshared.update(entries)
        return ok

    def start(self) -> None:
        self.subscription.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.subscription.stop(timeout)
        self.publisher.close()

    def _bodies(self, entries: list[tuple[str, int]]) -> Iterator[dict[str, Any]]:
        for start in range(0, len(entries), CHUNK):
            yield {"token": self.token, "gateway": self.gateway, "logouts": entries[start:start + CHUNK]}

    def _send_here(self, key: str, body: dict[str, Any]) -> None:
        """Publish on the subscription's connection (its thread; raises when that connection is lost, and the
        subscription then subscribes again, which sends everything again)."""
        if self._here is None:  # not subscribed yet
            self.publisher.publish(key, body)
        else:
            self._here(EVENTS_EXCHANGE, key, event_bytes(self.service, body))

    def _subscribed(self, publish: Publish) -> None:
        """After each (re)subscription: our whole list to the others, and a hello that asks for theirs."""
        self._here = publish
        with self._lock:
            self._unshared.clear()  # in the whole list
        for body in self._bodies(self.logouts.entries()):
            self._send_here(LOGOUT_KEY, body)
        self._send_here(HELLO_KEY, {"token": self.token, "gateway": self.gateway})

    def _share_unshared(self) -> None:
        """About every second while subscribed: the logouts the publisher could not send."""
        if self._here is None:
            return
        with self._lock:
            pending, self._unshared = self._unshared, {}
        now = time.time()
        entries = [(sid, expires) for sid, expires in pending.items() if expires > now]
        if entries:
            log.info("sharing %d console logouts made while the bus was unavailable", len(entries))
            for body in self._bodies(entries):
                self._send_here(LOGOUT_KEY, body)

    def _handle(self, body: bytes, routing_key: str) -> None:
        message = replica_messages.read(body, routing_key, MAX_MESSAGE, log, "console logouts")
        if message is None or not replica_messages.from_another(message.get("token"), self.token):
            return  # our own, or not well formed
        if routing_key == HELLO_KEY:
            for answer in self._bodies(self.logouts.entries()):
                self._send_here(LOGOUT_KEY, answer)
        elif routing_key == LOGOUT_KEY and isinstance(message.get("logouts"), list):
            now = time.time()
            for entry in message["logouts"][:CHUNK]:
                if isinstance(entry, list) and len(entry) == 2:
                    self.logouts.add(entry[0], entry[1], now)
