"""Tuner plugins in the plugin sandbox: what they can reach (nothing of the agent's), and their proposals
checked like a built-in tuner's (bounds, static policy, pool), refused with the reason when invalid.

The pool is the real one (vmsched.runtime): as root its worker switches to the plugin user ``nobody`` under
seccomp and Landlock, as the scheduling services' workers do.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsched.services.policy_agent.policy.model import parse_policy
from vmsched.services.policy_agent.tuners.config import TunerConfig
from vmsched.services.policy_agent.tuners.engine import Engine
from vmsched.services.policy_agent.tuners.types import GuestSample, GuestView, HostSample, TuneInput
from vmsched.services.policy_agent.adaptive.plugins import TunerPlugins

SHARED = frozenset({0, 1, 2, 3})
LIBVIRT_SOCK = "/run/libvirt/libvirt-sock"

SPY = '''
import os, socket

class Tuner:
    def do_tune(self, facts):
        found = {"uid": os.getuid(), "env": sorted(os.environ), "guests": sorted(facts["guests"])}
        for name, family, address in (("inet", socket.AF_INET, ("127.0.0.1", 5672)),
                                      ("libvirt", socket.AF_UNIX, %r), ("agent", socket.AF_UNIX, %r)):
            s = None
            try:
                s = socket.socket(family, socket.SOCK_STREAM)
                s.settimeout(2)
                s.connect(address)
                found[name] = "connected"
            except OSError as exc:
                found[name] = type(exc).__name__
            finally:
                if s is not None:
                    s.close()
        found["fds"] = sorted(os.readlink("/proc/self/fd/" + fd) for fd in os.listdir("/proc/self/fd")
                              if os.path.exists("/proc/self/fd/" + fd))
        return [{"guest": "g", "field": "report", "value": found, "reason": "spy"}]
'''
PROPOSER = '''
class Tuner:
    def do_tune(self, facts):
        g = facts["guests"]["g"]
        return [
            {"guest": "g", "field": "cpu_shares", "value": g["policy"]["adaptive"]["weight"][1], "reason": "max it"},
            {"guest": "g", "field": "cpu_shares", "value": 4096, "reason": "greedy"},
            {"guest": "g", "field": "vcpus", "value": {"0": "6-7"}, "reason": "into the pool"},
            {"guest": "g", "field": "vcpus", "value": {"0": "banana"}, "reason": "nonsense"},
            {"guest": "nobody-here", "field": "cpu_shares", "value": 600, "reason": "wrong guest"},
            "not a proposal",
        ]
'''
BROKEN = '''
class Tuner:
    def do_tune(self, facts):
        return {"not": "a list"}
'''
RAISES = '''
class Tuner:
    def do_tune(self, facts):
        raise RuntimeError("tuner bug")
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vmsched-tuners-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.py").write_text(text)
    (folder / f"{name}.py").chmod(0o644)


def guest_input() -> TuneInput:
    policy = parse_policy({"weight": 1024, "vcpu_pins": {0: "1"},
                           "adaptive": {"weight": [512, 2048], "may_move": True}})
    g = GuestView("g", "guest-g", policy, 1, {0: frozenset({1})}, 1024, None, 100000,
                  [GuestSample(50.0, 20.0)])
    return TuneInput(SHARED, [HostSample({0: 10.0, 1: 95.0})], {"g": g})


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches to the plugin user only when started as root")
def test_a_tuner_plugin_reaches_nothing_of_the_agent(folder, monkeypatch, tmp_path):
    monkeypatch.setenv("VMSCHED_AMQP_URL", "amqp://vmsched:s3cret@127.0.0.1:5672/")
    agent_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # stands for the agent's own socket
    agent_path = tempfile.mktemp(prefix="vmsched-agent-", suffix=".sock", dir="/tmp")
    agent_sock.bind(agent_path)
    os.chmod(agent_path, 0o600)
    agent_sock.listen(1)
    write(folder, "spy", SPY % (LIBVIRT_SOCK, agent_path))
    plugins = TunerPlugins(folder).start()
    try:
        (p,) = plugins.propose(guest_input(), TunerConfig())
    finally:
        plugins.close()
        agent_sock.close()
        os.unlink(agent_path)
    found = p.after
    assert found["uid"] != 0
    assert not [k for k in found["env"] if "AMQP" in k or "VMSCHED" in k], found["env"]
    assert found["inet"] == "PermissionError"  # no network socket at all
    assert found["agent"] == "PermissionError"  # a root-only socket stays closed to the plugin user
    # libvirtd's own socket (when it runs) may accept the connection; libvirtd then refuses the plugin user
    # (tests/e2e/libvirt/test_adaptive.py checks that with a real libvirtd)
    assert all(not f.startswith("socket:") for f in found["fds"]), found["fds"]  # no inherited connection
    assert found["guests"] == ["g"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches to the plugin user only when started as root")
def test_plugin_proposals_are_checked_and_bad_results_reported(folder):
    write(folder, "proposer", PROPOSER)
    write(folder, "broken", BROKEN)
    write(folder, "raises", RAISES)
    write(folder, "_helper", "X = 1\n")  # helpers are not tuners
    plugins = TunerPlugins(folder).start()
    try:
        inp = guest_input()
        proposals = plugins.propose(inp, TunerConfig())
        errors = dict(plugins.errors)
    finally:
        plugins.close()
    assert set(errors) == {"broken", "raises"}
    assert "expected a list of proposals" in errors["broken"] and "tuner bug" in errors["raises"]
    engine = Engine(TunerConfig(hysteresis=1, max_guest_changes=10), tuners={})
    engine.observe(HostSample({}), {})
    out = engine.step(inp, proposals)
    by_reason = {d.reason.split(" (proposed because: ")[-1].rstrip(")"): d for d in out}
    assert by_reason["max it"].outcome == "applied" and by_reason["max it"].after == 2048
    assert "outside the guest's range [512, 2048]" in by_reason["greedy"].reason
    assert "outside the shared set" in by_reason["into the pool"].reason
    assert "malformed CPU set" in by_reason["nonsense"].reason
    assert "unknown guest" in by_reason["wrong guest"].reason
    assert any("not an object" in d.reason and d.outcome == "refused" for d in out)
    assert all(d.tuner == "plugin:proposer" for d in out)
