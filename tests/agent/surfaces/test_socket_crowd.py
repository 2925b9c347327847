"""A crowded agent socket: many CLI callers and QEMU hooks at once, on the real agent (test driver); and the
socket's path, which appears only once it listens.

A guest that requires a shut-off guest must be refused by every concurrent
hook run, and no caller may be turned away because others came first.
"""

from __future__ import annotations

import os
import socketserver
import stat
import subprocess
import threading
from pathlib import Path

import libvirt
import pytest

from tests.support.agent_driver import conn, domain_xml, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.paths import ROOT
from vmsched.agent_contract import AgentOp
from vmsched.services.policy_agent.errors import AgentUnavailable
from vmsched.services.policy_agent.surfaces.client import SocketClient
from vmsched.services.policy_agent.surfaces.socket import SocketServer

CALLERS, CALLS, HOOKS = 8, 25, 16
HOOK = ROOT / "services" / "policy_agent" / "surfaces" / "hooks" / "qemu"


def test_concurrent_callers_and_hooks_are_all_answered(conn: libvirt.virConnect, make_agent, tmp_path: Path):
    a = make_agent()
    conn.defineXML(domain_xml("t-req"))  # shut off
    dependent = conn.defineXML(domain_xml("t-dep"))
    a.set_policy("t-dep", {"requires": ["t-req"]})
    xml = dependent.XMLDesc(0)  # what libvirtd gives the hook on stdin: the requirement is in its metadata
    env = {"PATH": os.environ["PATH"], "VMSCHED_HOOK_SOCKET": str(a.socket_path), "VMSCHED_HOOK_LOG": "",
           "VMSCHED_HOOK_CONFIG": str(tmp_path / "none.conf"), "VMSCHED_HOOK_INCOMING_DIR": str(tmp_path / "in")}
    client = SocketClient(a.socket_path)
    failures: list[str] = []
    hooks: list[subprocess.CompletedProcess[str]] = []
    gate = threading.Barrier(CALLERS + HOOKS)

    def caller() -> None:
        gate.wait()
        for _ in range(CALLS):
            try:
                client.call(AgentOp.LIST_POLICIES)
            except Exception as exc:  # noqa: BLE001 - counted
                failures.append(str(exc))

    def start_attempt() -> None:
        gate.wait()
        hooks.append(subprocess.run(["python3", "-S", str(HOOK), "t-dep", "prepare", "begin", "-"], input=xml,
                                    text=True, capture_output=True, env=env, timeout=60))

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    threads += [threading.Thread(target=start_attempt) for _ in range(HOOKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == [], f"{len(failures)} of {CALLERS * CALLS} calls failed, e.g. {failures[0]}"
    assert len(hooks) == HOOKS
    allowed = [h.stderr for h in hooks if h.returncode != 1]
    assert allowed == [], f"{len(allowed)} of {HOOKS} starts not refused: {allowed[0]}"
    assert all("'t-req' (shutoff)" in h.stderr for h in hooks)


def test_the_socket_appears_only_once_it_listens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A hook that finds the socket's path is answered (starting): never refused by a socket not listening yet."""
    path = tmp_path / "agent.sock"
    present_before_listening: list[bool] = []
    listen = socketserver.UnixStreamServer.server_activate

    def activate(server: socketserver.UnixStreamServer) -> None:
        present_before_listening.append(path.exists())
        listen(server)

    monkeypatch.setattr(socketserver.UnixStreamServer, "server_activate", activate)
    server = SocketServer(path)
    server.start()
    try:
        assert present_before_listening == [False]
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
        with pytest.raises(AgentUnavailable, match="the agent is starting"):
            SocketClient(path, timeout=0.2).call(AgentOp.PING)
    finally:
        server.stop()
    assert not path.exists()
