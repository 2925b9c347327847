"""Clients of an agent: the local UNIX socket, or its queue on the bus."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from vmsched.bus import BusError, RequestError
from vmsched.bus.rpc import call as bus_call
from vmsched.bus.topology import agent_queue

from ..policy.errors import AgentUnavailable, decode, from_reply


class SocketClient:
    """Client of a local agent: ``call(op, body) -> body`` or raises the agent's error."""

    def __init__(self, path: str | Path, timeout: float = 10.0):
        self.path = str(path)
        self.timeout = timeout

    def call(self, op: str, body: dict | None = None, timeout: float | None = None) -> dict:
        timeout = self.timeout if timeout is None else timeout
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            try:
                s.connect(self.path)
            except OSError as exc:
                raise AgentUnavailable(f"no agent at {self.path}: {exc.strerror or exc}") from None
            s.sendall((json.dumps({"op": op, "body": body or {}}) + "\n").encode())
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
        reply = json.loads(buf)
        if not reply.get("ok"):
            raise from_reply(reply.get("code"), reply.get("error") or "request failed")
        return reply.get("body") or {}


def call_bus(url: str, host: str, op: str, body: dict, timeout: float) -> dict:
    """One request to the agent of ``host`` over the bus; raises the agent's error."""
    try:
        return bus_call(url, agent_queue(host), op, body, timeout=timeout)
    except RequestError as exc:
        raise from_reply(*decode(str(exc))) from None
    except BusError as exc:
        raise AgentUnavailable(str(exc)) from None
