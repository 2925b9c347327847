"""A blocking RPC call over the bus, for the CLI and tools."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any

from kombu import Consumer, Producer
from kombu.message import Message

from vmsched.bus import BusTimeout, BusUnavailable, reply_error
from vmsched.bus.connection import CONNECTION_ERRORS, BusOptions, ensure_exchanges, open_connection, safe_release
from vmsched.bus.local import CARRIED, LANES, Request
from vmsched.bus.urls import mask
from vmsched.bus.topology import REPLY_EXCHANGE, REPLY_VIA, reply_queue as make_reply_queue, route
from pydantic import ValidationError

from vmsched.messages import Envelope, ErrorCode, ReplyEnvelope


def call(url: str | BusOptions, queue: str, op: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send one request to ``queue`` and return the reply body.

    Raises :class:`RequestError` (with the reply's ``code``) for an error reply, :class:`BusTimeout` when
    nobody answers in time and :class:`BusUnavailable` when the broker cannot
    be reached.
    """
    options = url if isinstance(url, BusOptions) else BusOptions(url=url, connect_timeout=min(timeout, 2.0))
    deadline = time.time() + timeout
    cid = uuid.uuid4().hex  # unguessable: only the requester knows which reply it waits for
    if options.embedded and queue in CARRIED:  # a service of this process takes it from its inbox
        return _from_inbox(queue, Envelope(op=op, deadline=deadline, body=body).model_dump_json().encode(), cid,
                           timeout)
    replies: list[ReplyEnvelope] = []
    exchange, key = route(queue)
    reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"

    def on_reply(message: Message) -> None:
        if message.properties.get("correlation_id") == cid:
            replies.append(_parsed(message.body, queue))

    returned: list[str] = []

    def on_return(exc: Exception, exchange: object, routing_key: str, message: object) -> None:
        returned.append(routing_key)

    conn = None
    try:
        conn = open_connection(options, blocking_confirms=True)
        ensure_exchanges(conn, (exchange, REPLY_EXCHANGE))
        channel = conn.default_channel
        with Consumer(channel, [make_reply_queue(reply_queue)], on_message=on_reply, no_ack=True):
            Producer(channel, auto_declare=False, on_return=on_return).publish(
                Envelope(op=op, deadline=deadline, body=body).model_dump_json().encode(),
                exchange=exchange,
                routing_key=key,
                mandatory=True,
                headers={REPLY_VIA: REPLY_EXCHANGE.name},
                content_type="application/json",
                content_encoding="utf-8",
                correlation_id=cid,
                reply_to=reply_queue,
                expiration=timeout,
                confirm_timeout=options.confirm_timeout,
            )
            while not replies:
                if returned:
                    raise BusUnavailable(f"nothing on the bus receives {queue} (is it running, with this host ID?)")
                remaining = deadline - time.time()
                if remaining <= 0:
                    raise BusTimeout(f"no reply from {queue} within {timeout:g} s (is the service running?)")
                try:
                    conn.drain_events(timeout=remaining)
                except socket.timeout:
                    continue
    except BusUnavailable:
        raise
    except CONNECTION_ERRORS as exc:
        raise BusUnavailable(f"message bus unavailable at {options.where}: {mask(str(exc))}") from None
    finally:
        safe_release(conn)
    return _body(replies[0], queue)


def _from_inbox(queue: str, payload: bytes, cid: str, timeout: float) -> dict[str, Any]:
    """The embedded bus's scheduling request (vmsched.bus.local), waited for at most ``timeout`` seconds."""
    answered = threading.Event()
    replies: list[bytes] = []
    LANES.put(Request(queue, payload, cid, lambda raw: (replies.append(raw), answered.set())))
    if not answered.wait(timeout):
        raise BusTimeout(f"no reply from {queue} within {timeout:g} s (is the service running?)")
    return _body(_parsed(replies[0], queue), queue)


def _parsed(raw: bytes | str, queue: str) -> ReplyEnvelope:
    try:
        return ReplyEnvelope.model_validate_json(raw)
    except ValidationError as exc:
        return ReplyEnvelope(ok=False, error=f"malformed reply from {queue}: {exc.errors()[0]['msg']}",
                             code=ErrorCode.INTERNAL)


def _body(reply: ReplyEnvelope, queue: str) -> dict[str, Any]:
    error = reply_error(reply, queue)
    if error is not None:
        raise error
    return reply.body
