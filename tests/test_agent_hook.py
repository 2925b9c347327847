"""The QEMU hook run as libvirtd runs it (argv + domain XML on stdin), against a stand-in agent socket.

The real agent answering the hook inside a real libvirtd is covered by
tests/e2e_libvirt/test_e2e_dependencies.py; this file covers the hook's own
decisions, including incoming migrations, which cannot be staged here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import ROOT

HOOK = ROOT / "services" / "policy_agent" / "surfaces" / "hooks" / "qemu"
XML = "<domain type='qemu'><name>dep</name><uuid>11111111-2222-3333-4444-555555555555</uuid></domain>"


class StandInAgent:
    """Answers check_start like the agent does, always with the same verdict."""

    def __init__(self, path: Path, allowed: bool) -> None:
        self.requests: list[dict] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        self.allowed = allowed
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = json.loads(conn.makefile("rb").readline())
                self.requests.append(request)
                body = {"allowed": self.allowed, "message": "" if self.allowed else "requirement 'req' is not running"}
                conn.sendall((json.dumps({"ok": True, "error": None, "code": None, "body": body}) + "\n").encode())

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "VMSCHED_HOOK_SOCKET": str(tmp_path / "agent.sock"),
            "VMSCHED_HOOK_LOG": str(tmp_path / "hook.log"), "VMSCHED_HOOK_CONFIG": str(tmp_path / "none.conf"),
            "VMSCHED_HOOK_INCOMING_DIR": str(tmp_path / "incoming"), "VMSCHED_HOOK_TIMEOUT": "2"}


@pytest.fixture
def denying(tmp_path: Path) -> Iterator[StandInAgent]:
    agent = StandInAgent(tmp_path / "agent.sock", allowed=False)
    yield agent
    agent.close()


def hook(env: dict[str, str], guest: str, op: str, sub: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", "-S", str(HOOK), guest, op, sub, "-"], input=XML, text=True,
                          capture_output=True, env=env, timeout=30)


def test_start_refused_with_the_agents_reason(env: dict[str, str], denying: StandInAgent):
    out = hook(env, "dep", "prepare", "begin")
    assert out.returncode == 1 and "requirement 'req' is not running" in out.stderr
    (request,) = denying.requests
    assert request["op"] == "check_start"
    assert request["body"]["uuid"] == "11111111-2222-3333-4444-555555555555" and request["body"]["xml"] == XML


def test_other_operations_pass_without_asking(env: dict[str, str], denying: StandInAgent):
    for op, sub in (("start", "begin"), ("started", "begin"), ("stopped", "end"), ("restore", "begin")):
        assert hook(env, "dep", op, sub).returncode == 0
    assert denying.requests == []


def test_incoming_migration_is_not_a_boot(env: dict[str, str], denying: StandInAgent):
    assert hook(env, "dep", "migrate", "begin").returncode == 0
    out = hook(env, "dep", "prepare", "begin")
    assert out.returncode == 0 and "incoming migration" in out.stderr
    assert denying.requests == []
    # the marker is consumed: the next boot is checked again
    assert hook(env, "dep", "prepare", "begin").returncode == 1
    # a migration that never got to prepare leaves nothing behind once released
    assert hook(env, "dep", "migrate", "begin").returncode == 0
    assert hook(env, "dep", "release", "end").returncode == 0
    assert hook(env, "dep", "prepare", "begin").returncode == 1


def test_stale_migration_marker_is_ignored(env: dict[str, str], denying: StandInAgent):
    assert hook(env, "dep", "migrate", "begin").returncode == 0
    marker = Path(env["VMSCHED_HOOK_INCOMING_DIR"]) / "dep"
    old = marker.stat().st_mtime - 600
    os.utime(marker, (old, old))
    assert hook(env, "dep", "prepare", "begin").returncode == 1


def test_unreachable_agent_allows_by_default_and_denies_when_configured(env: dict[str, str]):
    out = hook(env, "dep", "prepare", "begin")  # no agent listening
    assert out.returncode == 0 and "could not be asked" in out.stderr
    out = hook({**env, "VMSCHED_HOOK_ON_UNREACHABLE": "deny"}, "dep", "prepare", "begin")
    assert out.returncode == 1 and "on_unreachable=deny" in out.stderr
    assert "could not be asked" in Path(env["VMSCHED_HOOK_LOG"]).read_text()
