"""Clients of an agent: the local UNIX socket, or its queue on the bus."""

from __future__ import annotations

import errno
import json
import socket
import time
from pathlib import Path

from pydantic import ValidationError

from vmsched.agent_contract import AgentOp
from vmsched.bus import BusError, RequestError, reply_error
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import agent_queue
from vmsched.bus.transport import open_transport
from vmsched.messages import CONTRACT_VERSION, ReplyEnvelope

from ..errors import AgentUnavailable, from_reply

ABSENT = (errno.ENOENT, errno.ECONNREFUSED)  # nothing listens at the path
RETRY_FIRST, RETRY_MAX = 0.005, 0.1  # seconds between attempts on a busy or starting agent (doubling)
STARTING = "starting"  # body.state of the reply an agent gives while it starts (surfaces/socket.py)


class SocketClient:
    """Client of a local agent: ``call(op, body) -> body`` or raises the agent's error.

    ``hint`` ends the error when no agent listens at ``path`` (what the caller can do about it).
    A busy agent (its backlog full) and an agent that is starting are asked again until the timeout.
    """

    def __init__(self, path: str | Path, timeout: float = 10.0, hint: str = ""):
        self.path = str(path)
        self.timeout = timeout
        self.hint = hint

    def call(self, op: AgentOp | str, body: dict | None = None) -> dict:
        deadline = time.monotonic() + self.timeout
        pause = RETRY_FIRST
        reply = None
        while True:
            try:
                asked = self._exchange(op, body, deadline, pause)
            except AgentUnavailable:
                if reply is None or time.monotonic() < deadline:
                    raise
                break  # time ran out asking a starting agent again: that is why it has no answer
            if asked is not None:
                reply = asked
                if reply.ok or reply.body.get("state") != STARTING or deadline - time.monotonic() <= pause:
                    break
            time.sleep(pause)  # the agent is busy or starting: ask again
            pause = min(pause * 2, RETRY_MAX)
        error = reply_error(reply, f"the agent at {self.path}")
        if error is not None:
            raise from_reply(error.code, str(error), error.details)
        return reply.body

    def _exchange(self, op: AgentOp | str, body: dict | None, deadline: float, pause: float) -> ReplyEnvelope | None:
        """The agent's reply; None when its backlog is full (busy, not absent) and ``pause`` leaves time to ask
        again."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            s.connect(self.path)
        except OSError as exc:
            s.close()
            if exc.errno == errno.EAGAIN and deadline - time.monotonic() > pause:
                return None
            hint = f"; {self.hint}" if self.hint and exc.errno in ABSENT else ""
            raise AgentUnavailable(f"no agent at {self.path}: {exc.strerror or exc}{hint}") from None
        with s:
            request = {"v": CONTRACT_VERSION, "op": _name(op), "body": body or {}}
            s.sendall((json.dumps(request) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                s.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    chunk = s.recv(1 << 16)
                except socket.timeout:
                    raise AgentUnavailable(f"agent at {self.path} did not answer {op} within {self.timeout:g} s") from None
                if not chunk:
                    raise AgentUnavailable(f"agent at {self.path} closed the connection without answering")
                buf += chunk
        try:
            return ReplyEnvelope.model_validate_json(buf)
        except ValidationError as exc:
            raise AgentUnavailable(f"agent at {self.path} sent a malformed reply: {exc.errors()[0]['msg']}") from None


def call_bus(bus: str | BusOptions, host: str, op: AgentOp | str, body: dict, timeout: float) -> dict:
    """One request to the agent of ``host`` over the bus (a broker URL, or its options); raises the agent's error."""
    if isinstance(bus, str):
        bus = BusOptions(url=bus, connect_timeout=min(timeout, 2.0))
    transport = open_transport(bus)
    try:
        return transport.call(agent_queue(host), _name(op), body, timeout=timeout)
    except RequestError as exc:
        raise from_reply(exc.code, str(exc), exc.details) from None
    except BusError as exc:
        raise AgentUnavailable(str(exc)) from None


def _name(op: AgentOp | str) -> str:
    return op.value if isinstance(op, AgentOp) else op
