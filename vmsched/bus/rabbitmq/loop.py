"""A consumer thread's life on RabbitMQ: connect, serve, and on any failure reconnect with bounded backoff.

One loop for every long-lived consumer: the services' request consumers
(:mod:`vmsched.bus.rabbitmq.worker`) and the subscriptions (:class:`BrokerSubscription`: host facts, snapshot
requests, the gateways' decision questions).
"""

from __future__ import annotations

import logging
import socket
import threading
from contextlib import suppress
from typing import Callable

from kombu import Connection, Consumer, Producer, Queue
from kombu.message import Message

from vmsched.bus.rabbitmq.connection import CONNECTION_ERRORS, backoff, ensure_exchanges, note_lost, open_connection, \
    safe_release
from vmsched.bus.options import BusOptions, mask
from vmsched.bus.interface import Subscription
from vmsched.logs import BROKER_TROUBLE, broker

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
            BROKER_TROUBLE.clear(options.url)
            if attempt:
                log.info("%s: connected to %s", name, broker(conn.as_uri()))
                if on_reconnect is not None:
                    on_reconnect()
            attempt = 0
            serve(conn)
        except Exception as exc:  # noqa: BLE001 - a consumer thread must survive anything
            delay = backoff(attempt, options.reconnect_max_delay)
            attempt += 1
            if not isinstance(exc, CONNECTION_ERRORS):
                log.exception("%s: consumer failed; restarting in %.1f s", name, delay)
            else:
                note_lost(conn)
                held = BROKER_TROUBLE.allow(options.url)  # one line for all the threads of the process
                if held is not None:
                    log.warning("%s: bus connection to %s failed (%s); retrying in %.1f s%s", name,
                                broker(options.url), mask(str(exc)), delay, held)
            stop.wait(delay)
        finally:
            safe_release(conn)


class BrokerSubscription(Subscription):
    """A subscriber's own queue on RabbitMQ (:class:`~vmsched.bus.interface.Topic`): one thread with its own
    connection, reconnecting with backoff; an exclusive queue, gone with its connection."""

    def serve(self) -> None:
        run_reconnecting(self.transport.options, self.name, self.stopping, self._serve)

    def _serve(self, conn: Connection) -> None:
        topic = self.topic
        ensure_exchanges(conn, (topic.exchange, *topic.also))
        channel = conn.channel()
        queue = Queue(topic.queue, exchange=topic.exchange, routing_key=topic.keys[0], exclusive=True,
                      auto_delete=True, durable=False, queue_arguments={"x-max-length": topic.max_length})
        bound = queue(channel)
        bound.declare()
        for key in topic.keys[1:]:
            bound.bind_to(exchange=topic.exchange, routing_key=key)
        Consumer(channel, [queue], on_message=self._received, no_ack=True, auto_declare=False).consume()
        self.ready.set()
        if self.on_subscribed is not None:
            producer = Producer(channel, auto_declare=False)
            self.on_subscribed(lambda exchange, key, body: producer.publish(
                body, exchange=exchange, routing_key=key, content_type="application/json", retry=False))
        self._drain(conn)

    def _received(self, message: Message) -> None:
        """Give a no-ack message's body and routing key to ``on_message``; its failure is logged, never raised."""
        try:
            body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
            self.on_message(body, str(message.delivery_info.get("routing_key", "")))
        except Exception:  # noqa: BLE001 - a bad message must not stop the subscription
            log.exception("handling a %s message failed", self.name)

    def _drain(self, conn: Connection) -> None:
        while not self.stopping.is_set():
            try:
                conn.drain_events(timeout=1.0)
            except socket.timeout:
                conn.heartbeat_check()
            else:
                if self.linger > 0 and not self.stopping.wait(self.linger):
                    with suppress(socket.timeout):
                        while not self.stopping.is_set():
                            conn.drain_events(timeout=0)
            self.ticked()
