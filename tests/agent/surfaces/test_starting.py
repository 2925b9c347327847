"""The agent while it starts, on libvirt's test driver, asked by the real QEMU hook and the CLI's client.

Its socket is bound before it loads its state and answers "starting" until the agent is ready: the hook
refuses a guest with requirements then, whatever on_unreachable says, and the client waits for the answer.
Only an absent socket (or a refused connection) is "no agent". The start is held in its first step, the
libvirt connection, through the agent's public seam for it (``Agent(opener=...)``).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import libvirt
import pytest

from tests.support.agent_driver import TEST_URI, conn, state_dir  # noqa: F401 - fixtures
from tests.support.paths import ROOT
from tests.support.waiting import wait_until
from vmsched.services.policy_agent.agent import Agent
from vmsched.services.policy_agent.errors import AgentUnavailable
from vmsched.services.policy_agent.surfaces.client import SocketClient
from vmsched.services.policy_agent.virt import metadata

HOOK = ROOT / "services" / "policy_agent" / "surfaces" / "hooks" / "qemu"
UUID = "11111111-2222-3333-4444-555555555555"
XML = f"<domain type='qemu'><name>t-dep</name><uuid>{UUID}</uuid></domain>"
XML_REQUIRES = (f"<domain type='qemu'><name>t-dep</name><uuid>{UUID}</uuid><metadata>"
                f"<vmsched:policy xmlns:vmsched='{metadata.NS}'><vmsched:requires>t-req</vmsched:requires>"
                "</vmsched:policy></metadata></domain>")


def hook(env: dict[str, str], xml: str, on_unreachable: str = "allow") -> subprocess.CompletedProcess[str]:
    """The hook as libvirtd runs it for a start of t-dep."""
    return subprocess.run(["python3", "-S", str(HOOK), "t-dep", "prepare", "begin", "-"], input=xml, text=True,
                          capture_output=True, env={**env, "VMSCHED_HOOK_ON_UNREACHABLE": on_unreachable},
                          timeout=30)


def test_a_starting_agent_refuses_guests_with_requirements_and_answers_once_ready(conn, state_dir,  # noqa: F811
                                                                                 tmp_path: Path):
    gate = threading.Event()

    def held_open(uri: str) -> "libvirt.virConnect":
        assert gate.wait(30), "the test never let the agent go on"
        return libvirt.open(uri)

    agent = Agent(TEST_URI, "h1", state_dir, None, dedicated_pool="4-7", reconcile_interval=3600,
                  lock_dir=state_dir / "lock", opener=held_open)
    env = {"PATH": os.environ["PATH"], "VMSCHED_HOOK_SOCKET": str(agent.socket_path),
           "VMSCHED_HOOK_LOG": str(tmp_path / "hook.log"), "VMSCHED_HOOK_CONFIG": str(tmp_path / "none.conf"),
           "VMSCHED_HOOK_INCOMING_DIR": str(tmp_path / "incoming"), "VMSCHED_HOOK_TIMEOUT": "0.5"}
    starting = threading.Thread(target=agent.start, name="agent-start", daemon=True)
    starting.start()
    try:
        wait_until(lambda: agent.socket_path.exists(), timeout=10)
        with pytest.raises(AgentUnavailable, match="the agent is starting"):
            SocketClient(agent.socket_path, timeout=0.3).call("ping")
        for setting in ("allow", "deny"):
            out = hook(env, XML_REQUIRES, setting)
            assert out.returncode == 1, out.stderr
            assert "refusing to start t-dep: it requires 't-req'" in out.stderr
            assert "the agent is starting" in out.stderr
        out = hook(env, XML)  # no requirements: nothing to check, on_unreachable decides
        assert out.returncode == 0 and "unchecked" in out.stderr
        # a caller that asks while the agent starts gets its answer once it is ready
        answers: list[dict] = []
        waiting = threading.Thread(target=lambda: answers.append(SocketClient(agent.socket_path, timeout=20)
                                                                 .call("ping")))
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive() and not answers, "it keeps asking while the agent starts"
        gate.set()
        waiting.join(20)
        assert answers and answers[0]["host_id"] == "h1"
        starting.join(30)
        assert agent.started
        out = hook(env, XML_REQUIRES)  # ready: the agent's own answer
        assert out.returncode == 1 and "requires 't-req' (not defined on this host)" in out.stderr
        out = hook(env, XML)
        assert out.returncode == 0 and "unchecked" not in out.stderr
    finally:
        gate.set()
        starting.join(30)
        agent.stop()
    out = hook(env, XML_REQUIRES)  # stopped: no socket, no agent: on_unreachable decides
    assert out.returncode == 0 and "no policy agent listens" in out.stderr
