"""Clients of an agent: the local UNIX socket, or its queue on the bus."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from pydantic import ValidationError

from vmsched.agent_contract import AgentOp
from vmsched.bus import BusError, RequestError, reply_error
from vmsched.bus.connection import BusOptions
from vmsched.bus.rpc import call as bus_call
from vmsched.bus.topology import agent_queue
from vmsched.messages import CONTRACT_VERSION, ReplyEnvelope

from ..policy.errors import AgentUnavailable, from_reply


class SocketClient:
    """Client of a local agent: ``call(op, body) -> body`` or raises the agent's error."""

    def __init__(self, path: str | Path, timeout: float = 10.0):
        self.path = str(path)
        self.timeout = timeout

    def call(self, op: AgentOp | str, body: dict | None = None, timeout: float | None = None) -> dict:
        timeout = self.timeout if timeout is None else timeout
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            try:
                s.connect(self.path)
            except OSError as exc:
                raise AgentUnavailable(f"no agent at {self.path}: {exc.strerror or exc}") from None
            request = {"v": CONTRACT_VERSION, "op": _name(op), "body": body or {}}
            s.sendall((json.dumps(request) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                try:
                    chunk = s.recv(1 << 16)
                except socket.timeout:
                    raise AgentUnavailable(f"agent at {self.path} did not answer {op} within {timeout:g} s") from None
                if not chunk:
                    raise AgentUnavailable(f"agent at {self.path} closed the connection without answering")
                buf += chunk
        finally:
            s.close()
        try:
            reply = ReplyEnvelope.model_validate_json(buf)
        except ValidationError as exc:
            raise AgentUnavailable(f"agent at {self.path} sent a malformed reply: {exc.errors()[0]['msg']}") from None
        error = reply_error(reply, f"the agent at {self.path}")
        if error is not None:
            raise from_reply(error.code, str(error), error.details)
        return reply.body


def call_bus(url: str | BusOptions, host: str, op: AgentOp | str, body: dict, timeout: float) -> dict:
    """One request to the agent of ``host`` over the bus; raises the agent's error."""
    try:
        return bus_call(url, agent_queue(host), _name(op), body, timeout=timeout)
    except RequestError as exc:
        raise from_reply(exc.code, str(exc), exc.details) from None
    except BusError as exc:
        raise AgentUnavailable(str(exc)) from None


def _name(op: AgentOp | str) -> str:
    return op.value if isinstance(op, AgentOp) else op
