"""A consumer thread's life on the bus: connect, serve, and on any failure reconnect with bounded backoff.

One loop for every long-lived consumer: the services' request consumers
(:mod:`vmsched.bus.worker`), the facts subscription and snapshot listener
(:mod:`vmsched.bus.facts`) and the gateway's decision subscription.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

from kombu import Connection
from kombu.message import Message

from vmsched.bus.connection import CONNECTION_ERRORS, BusOptions, backoff, note_lost, open_connection, safe_release
from vmsched.bus.urls import mask

log = logging.getLogger(__name__)


def run_reconnecting(options: BusOptions, name: str, stop: threading.Event, serve: Callable[[Connection], None],
                     on_reconnect: Callable[[], None] | None = None) -> None:
    """Open a connection and ``serve(conn)`` until ``stop`` is set; on a broken connection or any other
    failure, release it, wait a bounded backoff and start again (``on_reconnect`` runs after each
    successful reconnection). With several broker URLs (a cluster) the next connection goes to another
    node first: one that answers, the lost one last."""
    attempt = 0
    while not stop.is_set():
        conn = None
        try:
            conn = open_connection(options)
            if attempt:
                log.info("%s: connected to %s", name, mask(getattr(conn, "bus_url", options.url)))
                if on_reconnect is not None:
                    on_reconnect()
            attempt = 0
            serve(conn)
        except CONNECTION_ERRORS as exc:
            note_lost(conn)
            delay = backoff(attempt, options.reconnect_max_delay)
            attempt += 1
            log.warning("%s: bus connection failed (%s); retrying in %.1f s", name, mask(str(exc)), delay)
            stop.wait(delay)
        except Exception:  # noqa: BLE001 - a consumer thread must survive anything
            delay = backoff(attempt, options.reconnect_max_delay)
            attempt += 1
            log.exception("%s: consumer failed; restarting in %.1f s", name, delay)
            stop.wait(delay)
        finally:
            safe_release(conn)


def hand_over(message: Message, on_message: Callable[[bytes, str], object], what: str) -> None:
    """Give a no-ack message's body and routing key to ``on_message``; its failure is logged, never raised."""
    try:
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        on_message(body, str(message.delivery_info.get("routing_key", "")))
    except Exception:  # noqa: BLE001 - a bad message must not stop the subscription
        log.exception("handling a %s message failed", what)


class ConsumerLoop:
    """One consumer thread with its own connection, reconnecting with backoff; subclasses give ``_serve``."""

    #: seconds to wait after a message has woken the thread, then take all that came meanwhile (one wake-up per
    #: batch instead of per message); 0: handle each message as it comes
    linger = 0.0

    def __init__(self, options: BusOptions, name: str) -> None:
        self.options = options.without_confirms()
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # subscribed at least once

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        run_reconnecting(self.options, self.name, self._stop, self._serve)

    def _drain(self, conn: Connection) -> None:
        self.ready.set()
        while not self._stop.is_set():
            try:
                conn.drain_events(timeout=1.0)
            except socket.timeout:
                conn.heartbeat_check()
                continue
            if self.linger > 0 and not self._stop.wait(self.linger):
                try:
                    while not self._stop.is_set():
                        conn.drain_events(timeout=0)
                except socket.timeout:
                    pass

    def _serve(self, conn: Connection) -> None:
        raise NotImplementedError
