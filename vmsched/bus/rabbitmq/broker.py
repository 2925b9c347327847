"""The bus on RabbitMQ, through kombu's public API: every party with connections of its own.

The service worker (:mod:`vmsched.bus.rabbitmq.worker`), the gateway's asyncio client (:mod:`vmsched.bus.rabbitmq.client`),
blocking requests (:mod:`vmsched.bus.rabbitmq.rpc`), event publishers (:mod:`vmsched.bus.rabbitmq.events`) and subscriptions
(:mod:`vmsched.bus.rabbitmq.loop`), each opening its connections to the broker's nodes (:mod:`vmsched.bus.rabbitmq.connection`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vmsched.bus.rabbitmq import rpc
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.events import EventPublisher
from vmsched.bus.interface import Transport
from vmsched.bus.rabbitmq.loop import BrokerSubscription
from vmsched.bus.replies import Handler
from vmsched.bus.rabbitmq.worker import ServiceWorker


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
        return rpc.call(self.options, queue, op, body, timeout)

    def events(self, service: str, *, confirm: bool = False) -> EventPublisher:
        return EventPublisher(self.options, service=service, confirm=confirm)
