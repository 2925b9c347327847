"""The bus on RabbitMQ, through kombu's public API: every party with connections of its own.

The service worker (:mod:`vmsched.bus.rabbitmq.worker`), the gateway's asyncio client
(:mod:`vmsched.bus.rabbitmq.client`), blocking requests (:meth:`BrokerTransport.call`), event publishers
(:mod:`vmsched.bus.rabbitmq.events`) and subscriptions (:mod:`vmsched.bus.rabbitmq.loop`), each opening its
connections to the broker's nodes (:mod:`vmsched.bus.rabbitmq.connection`).
"""

from __future__ import annotations

import socket
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

from kombu import Consumer, Producer
from kombu.message import Message

from vmsched.bus import BusTimeout, BusUnavailable, reply_body
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.rabbitmq.connection import CONNECTION_ERRORS, ensure_exchanges, open_connection, publish_json, \
    safe_release
from vmsched.bus.options import BusOptions, mask
from vmsched.bus.rabbitmq.events import EventPublisher
from vmsched.bus.interface import Transport, request_bytes
from vmsched.bus.rabbitmq.loop import BrokerSubscription
from vmsched.bus.replies import Handler
from vmsched.bus.rabbitmq.worker import ServiceWorker
from vmsched.bus.topology import REPLY_EXCHANGE, reply_queue as make_reply_queue, route


class BrokerTransport(Transport):
    spans_processes = True
    subscription = BrokerSubscription

    def __init__(self, options: BusOptions) -> None:
        self.options = options  # a broker's (memory:// is the in-process bus: open_connection refuses it)

    def worker(self, service: str, routes: dict[str, Handler], *, consumers: int = 1, prefetch: int = 2,
               journal_dir: Path | None = None) -> ServiceWorker:
        return ServiceWorker(self.options, service, routes=routes, consumers=consumers, prefetch=prefetch,
                             journal_dir=journal_dir)

    def client(self, service: str = "gateway", declare: tuple[str, ...] = ()) -> AsyncBusClient:
        return AsyncBusClient(self.options, declare=declare, service=service)

    def call(self, queue: str, op: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """Send one request to ``queue`` on a connection of its own and return the reply body.

        Raises :class:`RequestError` (with the reply's ``code``) for an error reply, :class:`BusTimeout` when
        nobody answers in time and :class:`BusUnavailable` when the broker cannot
        be reached.
        """
        deadline = time.time() + timeout
        cid = uuid.uuid4().hex  # unguessable: only the requester knows which reply it waits for
        replies: list[bytes | str] = []
        exchange, key = route(queue)
        reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"

        def on_reply(message: Message) -> None:
            if message.properties.get("correlation_id") == cid:
                replies.append(message.body)

        returned: list[str] = []

        def on_return(exc: Exception, exchange: object, routing_key: str, message: object) -> None:
            returned.append(routing_key)

        conn = None
        try:
            conn = open_connection(self.options, blocking_confirms=True)
            ensure_exchanges(conn, (exchange, REPLY_EXCHANGE))
            channel = conn.default_channel
            with Consumer(channel, [make_reply_queue(reply_queue)], on_message=on_reply, no_ack=True):
                publish_json(Producer(channel, auto_declare=False, on_return=on_return),
                             request_bytes(op, deadline, body), exchange, key, mandatory=True, correlation_id=cid,
                             reply_to=reply_queue, expiration=timeout, confirm_timeout=self.options.confirm_timeout)
                while not replies:
                    if returned:
                        raise BusUnavailable(f"nothing on the bus receives {queue} "
                                             "(is it running, with this host ID?)")
                    remaining = deadline - time.time()
                    if remaining <= 0:
                        raise BusTimeout(f"no reply from {queue} within {timeout:g} s (is the service running?)")
                    with suppress(socket.timeout):
                        conn.drain_events(timeout=remaining)
        except BusUnavailable:
            raise
        except CONNECTION_ERRORS as exc:
            raise BusUnavailable(f"message bus unavailable at {self.options.where}: {mask(str(exc))}") from None
        finally:
            safe_release(conn)
        return reply_body(replies[0], queue)

    def events(self, service: str, *, confirm: bool = False) -> EventPublisher:
        return EventPublisher(self.options, service=service, confirm=confirm)
