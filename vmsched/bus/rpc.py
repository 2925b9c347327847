"""A blocking RPC call over the bus, for the CLI and tools."""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any

from kombu import Consumer, Producer, Queue
from kombu.message import Message

from vmsched.bus import BusTimeout, BusUnavailable, RequestError, reply_error
from vmsched.bus.connection import CONNECTION_ERRORS, BusOptions, open_connection, safe_release
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
    replies: list[ReplyEnvelope] = []
    cid = uuid.uuid4().hex
    reply_queue = f"vmsched.reply.{uuid.uuid4().hex}"

    def on_reply(message: Message) -> None:
        if message.properties.get("correlation_id") == cid:
            try:
                replies.append(ReplyEnvelope.model_validate_json(message.body))
            except ValidationError as exc:
                replies.append(ReplyEnvelope(ok=False, error=f"malformed reply from {queue}: {exc.errors()[0]['msg']}",
                                             code=ErrorCode.INTERNAL))

    conn = None
    try:
        conn = open_connection(options, blocking_confirms=True)
        channel = conn.default_channel
        q = Queue(reply_queue, exchange="", routing_key=reply_queue, exclusive=True, auto_delete=True)
        with Consumer(channel, [q], on_message=on_reply, no_ack=True):
            Producer(channel, auto_declare=False).publish(
                Envelope(op=op, deadline=deadline, body=body).model_dump_json().encode(),
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
                correlation_id=cid,
                reply_to=reply_queue,
                expiration=timeout,
                confirm_timeout=options.confirm_timeout,
            )
            while not replies:
                remaining = deadline - time.time()
                if remaining <= 0:
                    raise BusTimeout(f"no reply from {queue} within {timeout:g} s (is the service running?)")
                try:
                    conn.drain_events(timeout=remaining)
                except socket.timeout:
                    continue
    except CONNECTION_ERRORS as exc:
        raise BusUnavailable(f"message bus unavailable at {_redact(options.url)}: {exc}") from None
    finally:
        safe_release(conn)
    error = reply_error(replies[0], queue)
    if error is not None:
        raise error
    return replies[0].body


def _redact(url: str) -> str:
    """Hide the password of an AMQP URL in messages."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
