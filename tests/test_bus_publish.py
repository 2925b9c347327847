"""vmsched.bus.publish: on py-amqp the same frames as kombu's Producer.publish; elsewhere kombu's own path."""

from __future__ import annotations

import pytest
from kombu import Connection, Producer

from vmsched.bus.connection import BusOptions, ensure_exchanges, open_connection, safe_release
from vmsched.bus.publish import Publisher
from vmsched.bus.topology import EXCHANGES, REPLY_EXCHANGE, REPLY_VIA, route


def _written(channel: object, publish: object) -> bytes:
    """The bytes one publish writes on the channel's socket (kept from the broker: nothing is sent)."""
    transport = channel.connection.transport  # type: ignore[attr-defined]
    frames: list[bytes] = []
    send, transport._write = transport._write, lambda data: frames.append(bytes(data))
    try:
        publish()  # type: ignore[operator]
    finally:
        transport._write = send
    return b"".join(frames)


@pytest.mark.parametrize("target", ["request", "reply", "reply-default-exchange"])
def test_the_same_frames_as_kombu(rabbit_vhost: str, target: str) -> None:
    conn = open_connection(BusOptions(url=rabbit_vhost))
    try:
        ensure_exchanges(conn, EXCHANGES)
        channel = conn.channel()
        producer = Producer(channel, auto_declare=False)
        publisher = Publisher(producer)
        assert publisher._channel is channel  # the direct path is taken
        exchange, key = route("vmsched.scoring.v2")
        if target == "reply":
            exchange, key = REPLY_EXCHANGE, "vmsched.reply.abc"
        elif target == "reply-default-exchange":
            exchange, key = "", "vmsched.reply.abc"
        headers = {REPLY_VIA: REPLY_EXCHANGE.name} if target == "request" else None
        extra = {"reply_to": "vmsched.reply.abc", "expiration": 1.5} if target == "request" else {}
        body = b'{"op":"filter","body":{"hosts":["h1","h2"]}}'

        def old() -> None:
            producer.publish(body, routing_key=key, exchange=exchange, headers=headers, content_type="application/json",
                             content_encoding="utf-8", correlation_id="c0ffee-1", retry=False, confirm_timeout=2.0,
                             **extra)

        def new() -> None:
            publisher.publish(body, exchange, key, headers=headers, content_type="application/json",
                              content_encoding="utf-8", correlation_id="c0ffee-1", confirm_timeout=2.0, **extra)

        before, after = _written(channel, old), _written(channel, new)
        assert before and after == before
        assert b"c0ffee-1" in after and body in after
        assert (b"1500" in after) == (target == "request")  # the expiration, in milliseconds
    finally:
        safe_release(conn)


def test_other_channels_go_through_kombu() -> None:
    with Connection("memory://") as conn:
        channel = conn.channel()
        sent: list[tuple[tuple, dict]] = []
        producer = Producer(channel, auto_declare=False)
        producer.publish = lambda *a, **kw: sent.append((a, kw))  # type: ignore[method-assign]
        publisher = Publisher(producer)
        assert publisher._channel is None
        publisher.publish(b"x", "", "q", content_type="application/json", content_encoding="utf-8",
                          correlation_id="c1", expiration=2.0)
        assert sent == [((b"x",), {"routing_key": "q", "exchange": "", "headers": None,
                                   "content_type": "application/json", "content_encoding": "utf-8",
                                   "expiration": 2.0, "confirm_timeout": None, "retry": False,
                                   "correlation_id": "c1"})]
