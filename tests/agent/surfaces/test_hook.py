"""The QEMU hook run as libvirtd runs it (argv + domain XML on stdin), against a stand-in agent socket.

The real agent answering the hook inside a real libvirtd is covered by
tests/e2e/libvirt/test_dependencies.py; this file covers the hook's own
decisions, including incoming migrations, which cannot be staged here; and the
agent's socket client, where it shares the hook's rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.paths import ROOT
from vmsched.messages import CONTRACT_VERSION
from vmsched.services.policy_agent.errors import AgentUnavailable
from vmsched.services.policy_agent.surfaces.client import SocketClient
from vmsched.services.policy_agent.surfaces.socket import STARTING
from vmsched.services.policy_agent.virt import metadata

HOOK = ROOT / "services" / "policy_agent" / "surfaces" / "hooks" / "qemu"
XML = "<domain type='qemu'><name>dep</name><uuid>11111111-2222-3333-4444-555555555555</uuid></domain>"
#: the same guest with a start requirement in its metadata, as libvirt passes it to the hook
XML_REQUIRES = ("<domain type='qemu'><name>dep</name><uuid>11111111-2222-3333-4444-555555555555</uuid><metadata>"
                f"<vmsched:policy xmlns:vmsched='{metadata.NS}'><vmsched:requires>req</vmsched:requires>"
                "</vmsched:policy></metadata></domain>")


class StandInAgent:
    """Answers check_start like the agent does, always with the same verdict; ``starting``: with the agent's
    reply while it starts, to every request; ``mute_after``: after that many requests, it answers none (it holds
    each connection for a second, then closes it)."""

    def __init__(self, path: Path, allowed: bool, starting: bool = False, mute_after: int | None = None) -> None:
        self.requests: list[dict] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        self.allowed = allowed
        self.starting = starting
        self.mute_after = mute_after
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
                if self.mute_after is not None and len(self.requests) > self.mute_after:
                    time.sleep(1.0)
                    continue
                body = {"allowed": self.allowed, "message": "" if self.allowed else "requirement 'req' is not running"}
                reply = STARTING if self.starting else {"ok": True, "error": None, "code": None, "body": body}
                with contextlib.suppress(OSError):  # the hook gave up on this one: serve the next connection
                    conn.sendall((json.dumps(reply) + "\n").encode())

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


def hook(env: dict[str, str], guest: str, op: str, sub: str, xml: str = XML) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", "-S", str(HOOK), guest, op, sub, "-"], input=xml, text=True,
                          capture_output=True, env=env, timeout=30)


def test_start_refused_with_the_agents_reason(env: dict[str, str], denying: StandInAgent):
    out = hook(env, "dep", "prepare", "begin")
    assert out.returncode == 1 and "requirement 'req' is not running" in out.stderr
    (request,) = denying.requests
    assert request["op"] == "check_start" and request["v"] == CONTRACT_VERSION  # the installed agent's version
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


def test_no_agent_at_all_leaves_a_guest_with_requirements_to_on_unreachable(env: dict[str, str], tmp_path: Path):
    """At host boot libvirtd autostarts guests before the agent runs: nothing listens (no file, or refused)."""
    out = hook(env, "dep", "prepare", "begin", XML_REQUIRES)  # no socket file
    assert out.returncode == 0 and "allowing dep to start unchecked" in out.stderr
    assert "no policy agent listens" in out.stderr
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(env["VMSCHED_HOOK_SOCKET"])  # a socket file nobody listens on: connection refused
    stale.close()
    out = hook(env, "dep", "prepare", "begin", XML_REQUIRES)
    assert out.returncode == 0 and "unchecked" in out.stderr
    out = hook({**env, "VMSCHED_HOOK_ON_UNREACHABLE": "deny"}, "dep", "prepare", "begin", XML_REQUIRES)
    assert out.returncode == 1 and "on_unreachable=deny" in out.stderr


def test_a_starting_agent_is_busy_not_absent(env: dict[str, str], tmp_path: Path):
    """An agent that answers "starting" (its state not loaded yet) is there: it is asked again within the
    budget, then a guest with requirements is refused whatever on_unreachable says."""
    agent = StandInAgent(tmp_path / "agent.sock", allowed=True, starting=True)
    try:
        fast = {**env, "VMSCHED_HOOK_TIMEOUT": "1"}
        for setting in ("allow", "deny"):
            out = hook({**fast, "VMSCHED_HOOK_ON_UNREACHABLE": setting}, "dep", "prepare", "begin", XML_REQUIRES)
            assert out.returncode == 1, out.stderr
            assert "refusing to start dep: it requires 'req'" in out.stderr and "the agent is starting" in out.stderr
        assert len(agent.requests) > 2, "asked again while it starts"
        # a guest without requirements has nothing to check: on_unreachable decides
        out = hook(fast, "dep", "prepare", "begin")
        assert out.returncode == 0 and "unchecked" in out.stderr and "the agent is starting" in out.stderr
        assert hook({**fast, "VMSCHED_HOOK_ON_UNREACHABLE": "deny"}, "dep", "prepare", "begin").returncode == 1
    finally:
        agent.close()


def test_time_running_out_on_a_starting_agent_names_the_start(env: dict[str, str], tmp_path: Path):
    """An agent that answered "starting" and then gives no answer before the budget ends (a loaded host): the
    refusal says the agent is starting, the reason it was asked again, not only that time ran out."""
    agent = StandInAgent(tmp_path / "agent.sock", allowed=True, starting=True, mute_after=1)
    try:
        out = hook({**env, "VMSCHED_HOOK_TIMEOUT": "0.5"}, "dep", "prepare", "begin", XML_REQUIRES)
        assert out.returncode == 1, out.stderr
        assert "refusing to start dep: it requires 'req'" in out.stderr and "the agent is starting" in out.stderr
        assert len(agent.requests) >= 2, "asked again after the first answer"
    finally:
        agent.close()


def test_time_running_out_on_a_starting_agent_names_the_start_in_the_socket_client(tmp_path: Path):
    """The CLI's client has the hook's rule: time that runs out asking a starting agent again says it is starting."""
    agent = StandInAgent(tmp_path / "agent.sock", allowed=True, starting=True, mute_after=1)
    try:
        with pytest.raises(AgentUnavailable, match="the agent is starting"):
            SocketClient(tmp_path / "agent.sock", timeout=0.5).call("check_start", {"guest": "dep"})
        assert len(agent.requests) >= 2, "asked again after the first answer"
    finally:
        agent.close()


def crowded(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket that accepts nothing, its backlog filled: every further connect gets EAGAIN."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)
    waiting: list[socket.socket] = []
    while True:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(str(path))
        except BlockingIOError:
            c.close()
            return server, waiting
        waiting.append(c)


def test_busy_agent_never_lets_a_guest_with_requirements_start_unchecked(env: dict[str, str], tmp_path: Path):
    server, waiting = crowded(tmp_path / "agent.sock")
    try:
        fast = {**env, "VMSCHED_HOOK_TIMEOUT": "0.3"}
        out = hook(fast, "dep", "prepare", "begin", XML_REQUIRES)
        assert out.returncode == 1, out.stderr
        assert "refusing to start dep: it requires 'req'" in out.stderr and "no usable answer" in out.stderr
        assert "refusing to start dep" in Path(env["VMSCHED_HOOK_LOG"]).read_text()
        # on_unreachable=allow speaks of an absent agent only: it does not open the door here
        assert hook({**fast, "VMSCHED_HOOK_ON_UNREACHABLE": "allow"}, "dep", "prepare", "begin",
                    XML_REQUIRES).returncode == 1
        # a guest without requirements has nothing to check: on_unreachable decides as before
        out = hook(fast, "dep", "prepare", "begin")
        assert out.returncode == 0 and "unchecked" in out.stderr
        assert hook({**fast, "VMSCHED_HOOK_ON_UNREACHABLE": "deny"}, "dep", "prepare", "begin").returncode == 1
        # unreadable domain XML: its requirements are unknown, so it is refused too
        assert hook(fast, "dep", "prepare", "begin", "<domain").returncode == 1
    finally:
        for c in waiting:
            c.close()
        server.close()


def test_slow_agent_never_lets_a_guest_with_requirements_start_unchecked(env: dict[str, str], tmp_path: Path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "agent.sock"))
    server.listen()
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(2)), daemon=True).start()
    try:
        started = time.monotonic()
        out = hook({**env, "VMSCHED_HOOK_TIMEOUT": "0.5"}, "dep", "prepare", "begin", XML_REQUIRES)
        assert out.returncode == 1 and "it requires 'req'" in out.stderr
        assert time.monotonic() - started < 10  # within its budget (plus the interpreter's start)
    finally:
        server.close()


def test_busy_agent_is_asked_again_within_the_budget(env: dict[str, str], tmp_path: Path):
    """The backlog is full at first; once the agent accepts again, the hook gets its answer."""
    server, waiting = crowded(tmp_path / "agent.sock")
    requests: list[dict] = []

    def free_later() -> None:
        time.sleep(1.0)  # well after the hook's first attempts
        for c in waiting:
            c.close()
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline()
                if not line:
                    continue  # one of the connections that filled the backlog
                requests.append(json.loads(line))
                body = {"allowed": False, "message": "requirement 'req' is not running"}
                conn.sendall((json.dumps({"ok": True, "body": body}) + "\n").encode())

    threading.Thread(target=free_later, daemon=True).start()
    try:
        out = hook({**env, "VMSCHED_HOOK_TIMEOUT": "5"}, "dep", "prepare", "begin", XML_REQUIRES)
        assert out.returncode == 1 and "requirement 'req' is not running" in out.stderr, out.stderr
        assert [r["op"] for r in requests] == ["check_start"]
    finally:
        server.close()


def test_hook_reads_the_agents_metadata_namespace():
    assert f'POLICY_NS = "{metadata.NS}"' in HOOK.read_text()
