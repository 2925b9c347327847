"""The agent's local UNIX socket: newline-delimited JSON requests and replies.

Request ``{"v": 2, "op": OP, "body": {...}}``; reply
``{"v", "ok", "error", "code", "details", "body"}``, the bus's reply envelope.
One thread per connection, so the QEMU hook's ``check_start`` is answered
even while a ``start_domain`` request waits for the guests it starts.

The socket is bound before the agent loads its state: until the agent is
ready (:meth:`SocketServer.serve`) every request gets the :data:`STARTING`
reply, so that a caller tells an agent that is starting from no agent at all
(no socket, or connection refused).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
from pathlib import Path
from typing import Any

from vmsched.messages import CONTRACT_VERSION, ErrorCode, ReplyEnvelope

from ..errors import AgentError, AgentUnavailable, PolicyError
from .client import STARTING
from .ops import Agent, dispatch

log = logging.getLogger(__name__)

MAX_LINE = 4 << 20
#: the reply to every request while the agent starts: code unavailable, body {"state": "starting"}
STARTING = ReplyEnvelope(ok=False, error="the agent is starting (it loads its state and checks the guests); ask"
                         " again in a moment", code=ErrorCode.UNAVAILABLE, body={"state": STARTING}
                         ).model_dump(mode="json")
#: connections waiting to be accepted; the kernel caps it at net.core.somaxconn. socketserver's 5
#: refused callers (EAGAIN) as soon as a few CLI calls and QEMU hooks arrived together.
BACKLOG = socket.SOMAXCONN


def handle_request(agent: Agent | None, request: Any) -> dict:
    """One decoded request -> the reply document (never raises); None: the agent is starting."""
    if agent is None:
        return STARTING
    if not isinstance(request, dict) or not isinstance(request.get("op"), str) or "body" not in request:
        return _error(f'a request is a JSON object {{"v": {CONTRACT_VERSION}, "op": OP, "body": {{...}}}}',
                      ErrorCode.INVALID)
    if (version := request.get("v")) != CONTRACT_VERSION or isinstance(version, bool):
        return _error(f"contract version {version!r} is not this agent's ({CONTRACT_VERSION}): use the vmsched"
                      " installed with the agent", ErrorCode.UNSUPPORTED_VERSION)
    op, body = request["op"], request["body"]
    try:
        return ReplyEnvelope(ok=True, body=dispatch(agent, op, body)).model_dump(mode="json")
    except AgentError as exc:
        return _error(str(exc), exc.code, exc.errors if isinstance(exc, PolicyError) else ())
    except Exception as exc:  # noqa: BLE001 - report, keep serving
        log.exception("%s request failed", op)
        return _error(f"internal error: {type(exc).__name__}: {exc}", ErrorCode.INTERNAL)


def _error(message: str, code: str, details: Any = ()) -> dict:
    return ReplyEnvelope(ok=False, error=message, code=code, details=list(details)).model_dump(mode="json")


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        owner: SocketServer = self.server.owner  # type: ignore[attr-defined]
        for line in iter(lambda: self.rfile.readline(MAX_LINE), b""):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except ValueError as exc:
                reply = _error(f"request is not JSON: {exc}", ErrorCode.INVALID)
            else:
                reply = handle_request(owner.agent, request)
            try:
                self.wfile.write((json.dumps(reply) + "\n").encode())
                self.wfile.flush()
            except OSError:
                return


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = BACKLOG


class SocketServer:
    """The agent's socket: :meth:`start` binds it (requests get the starting reply), :meth:`serve` hands it the
    agent, which answers from then on."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.agent: Agent | None = None  # None while the agent starts
        self._server: _Server | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            if _listening(self.path):
                raise AgentUnavailable(f"another agent is already listening on {self.path}")
            self.path.unlink()  # stale socket of a previous run
        # bound and listening under another name, then moved into place: a caller that finds the path (the QEMU
        # hook) is never refused by a socket that does not listen yet, nor by its mode
        bound = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        bound.unlink(missing_ok=True)
        self._server = _Server(str(bound), _Handler)
        self._server.owner = self  # type: ignore[attr-defined]
        os.chmod(bound, 0o660)  # the agent's group (the CLI, the QEMU hook) may connect
        os.replace(bound, self.path)
        threading.Thread(target=self._server.serve_forever, args=(0.1,), name="agent-socket", daemon=True).start()
        log.info("listening on %s (answering 'starting' until the agent is ready)", self.path)

    def serve(self, agent: Agent) -> None:
        """The agent is ready: it answers every request from now on."""
        self.agent = agent
        log.info("ready on %s", self.path)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)
        self._server = None


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True
