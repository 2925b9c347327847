"""Publishing on a py-amqp channel without kombu's per-call work.

``kombu.Producer.publish`` rebuilds, for every message, what does not change between requests
(the delivery mode of the exchange, empty declare and retry-policy lists, the serializer look-up
of a body that is bytes already) before it builds the very ``amqp.Message`` written here. On
RabbitMQ (a py-amqp channel) :class:`Publisher` builds that message itself: the same properties,
so the same frames on the wire (tests/test_bus_publish.py compares them byte for byte). Any other
channel (the embedded bus, ``memory://``) goes through kombu's producer as before.
"""

from __future__ import annotations

from typing import Any

import amqp
from kombu import Exchange, Producer


class Publisher:
    """Publishes bytes on ``producer``'s channel: directly on py-amqp, else through ``producer``."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        channel = producer.channel
        self._channel: amqp.Channel | None = channel if isinstance(channel, amqp.Channel) else None
        self._modes: dict[str, int] = {}  # exchange name -> delivery mode, as kombu decides it

    def publish(self, body: bytes, exchange: Exchange | str, routing_key: str, *, content_type: str,
                content_encoding: str, headers: dict[str, Any] | None = None, expiration: float | None = None,
                confirm_timeout: float | None = None, **properties: Any) -> None:
        """``Producer.publish(body, routing_key=, exchange=, headers=, content_type=, content_encoding=,
        expiration=, confirm_timeout=, retry=False, **properties)``: the same message, without kombu's
        per-call work on py-amqp."""
        channel = self._channel
        if channel is None:
            self.producer.publish(body, routing_key=routing_key, exchange=exchange, headers=headers,
                                  content_type=content_type, content_encoding=content_encoding,
                                  expiration=expiration, confirm_timeout=confirm_timeout, retry=False,
                                  **properties)
            return
        name = exchange.name if isinstance(exchange, Exchange) else exchange
        mode = self._modes.get(name)
        if mode is None:
            mode = self._modes[name] = self.producer._delivery_details(exchange, None)[1]
        if expiration is not None:
            properties["expiration"] = str(int(expiration * 1000))
        channel.basic_publish(
            amqp.Message(body, content_type=content_type, content_encoding=content_encoding,
                         application_headers={} if headers is None else headers, delivery_mode=mode,
                         priority=0, **properties),  # 0: kombu's default priority
            exchange=name, routing_key=routing_key, confirm_timeout=confirm_timeout)
