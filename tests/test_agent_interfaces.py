"""The agent's interfaces: local socket, CLI, bus RPC (embedded bus) and the gateway's /v1/hosts router."""

from __future__ import annotations

import argparse
import json
import socket

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from vmsched.services.policy_agent.agent import serve
from vmsched.services.policy_agent.surfaces.cli import register
from vmsched.services.policy_agent.policy.errors import GuestNotFound, PolicyError
from vmsched.services.policy_agent.surfaces.client import SocketClient
from tests.agent_testing import live_pins, wait_until
from tests.test_agent_driver import conn, guest, make_agent, state_dir  # noqa: F401 - fixtures
from vmsched.messages import Envelope


def run_cli(argv: list[str], capsys) -> tuple[int, dict | None, str]:
    parser = argparse.ArgumentParser(prog="vmsched")
    register(parser.add_subparsers(dest="command", required=True), serve)
    args = parser.parse_args(argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


# --- socket ----------------------------------------------------------------------------
def test_socket_protocol(conn, make_agent):
    a = make_agent()
    guest(conn, "t-sock")
    client = SocketClient(a.socket_path)
    assert client.call("ping")["host_id"] == "h1"
    view = client.call("set_policy", {"guest": "t-sock", "policy": {"dedicated": 2}})
    assert view["allocation"] == "4-5"
    assert client.call("cpus")["allocations"] == {"t-sock": "4-5"}
    with pytest.raises(GuestNotFound):
        client.call("get_policy", {"guest": "t-missing"})
    with pytest.raises(PolicyError, match="asks for 9 dedicated CPUs"):
        client.call("set_policy", {"guest": "t-sock", "policy": {"dedicated": 9}})
    with pytest.raises(PolicyError, match="unknown operation 'nope'"):
        client.call("nope")
    # raw wire: several requests on one connection, the hook's flat form, garbage
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(a.socket_path))
        f = s.makefile("rwb")
        f.write(b'{"op": "check_start", "guest": "t-sock", "uuid": null}\nnot json\n{"op": "list_policies"}\n')
        f.flush()
        first, second, third = (json.loads(f.readline()) for _ in range(3))
    assert first["ok"] and first["body"]["allowed"] is True
    assert second == {"ok": False, "error": second["error"], "code": "invalid", "body": {}}
    assert [p["guest"] for p in third["body"]["policies"]] == ["t-sock"]


# --- CLI ---------------------------------------------------------------------------------
def test_cli_policy_commands(conn, make_agent, capsys, tmp_path):
    a = make_agent()
    dom = guest(conn, "t-cli")
    sock = ["--socket", str(a.socket_path)]
    code, out, _ = run_cli(["policy", "set", "t-cli", "--pin", "0=1", "--pin", "1=2-3,^3", "--weight", "500",
                            "--cap", "50", *sock], capsys)
    assert code == 0 and out["policy"] == {"vcpu_pins": {"0": "1", "1": "2"}, "weight": 500, "cap_percent": 50.0}
    assert live_pins(dom) == {0: "1", 1: "2"}
    code, out, _ = run_cli(["policy", "set", "t-cli", "--merge", "--emulator-pin", "0", *sock], capsys)
    assert code == 0 and out["policy"]["weight"] == 500 and out["policy"]["emulator_pin"] == "0"
    f = tmp_path / "p.yaml"
    f.write_text("guest: t-cli\npolicy:\n  dedicated: 2\n  requires: [t-other]\n")
    code, out, _ = run_cli(["policy", "set", "t-cli", "--file", str(f), *sock], capsys)
    assert code == 0 and out["allocation"] == "4-5" and out["warnings"]
    code, out, _ = run_cli(["policy", "get", "t-cli", *sock], capsys)
    assert out["policy"] == {"dedicated": 2, "requires": ["t-other"]}
    code, out, _ = run_cli(["policy", "list", *sock], capsys)
    assert [p["guest"] for p in out["policies"]] == ["t-cli"]
    code, out, _ = run_cli(["policy", "cpus", *sock], capsys)
    assert out["free"] == "6-7"
    code, out, err = run_cli(["policy", "check-start", "t-cli", *sock], capsys)
    assert code == 1 and "'t-other' (not defined on this host)" in err
    # refusals: exit 1 with the precise reason; unknown guest 4; no agent 3; bad usage 2
    code, _, err = run_cli(["policy", "set", "t-cli", "--weight", "1", *sock], capsys)
    assert code == 1 and "weight (cpu_shares) 1 outside libvirt's range 2-262144" in err
    code, _, err = run_cli(["policy", "set", "t-cli", "--pin", "x", *sock], capsys)
    assert code == 1 and "expected VCPU=CPUSET" in err
    code, _, err = run_cli(["policy", "get", "t-nope", *sock], capsys)
    assert code == 4 and "t-nope" in err
    code, _, err = run_cli(["policy", "list", "--socket", "/nonexistent/agent.sock"], capsys)
    assert code == 3 and "no agent at /nonexistent/agent.sock" in err
    code, _, err = run_cli(["policy", "list", "--amqp", "memory://"], capsys)
    assert code == 2 and "--amqp needs --host" in err
    code, out, _ = run_cli(["policy", "pool", "6-7", *sock], capsys)
    assert code == 0 and out["allocations"] == {"t-cli": "6-7"}
    code, out, _ = run_cli(["policy", "delete", "t-cli", *sock], capsys)
    assert code == 0 and out["deleted"] is True


def test_cli_domain_start_stop(conn, make_agent, capsys):
    a = make_agent()
    db, web = guest(conn, "t-db", start=False), guest(conn, "t-web", start=False)
    a.set_policy("t-web", {"requires": ["t-db"]})
    sock = ["--socket", str(a.socket_path)]
    code, out, _ = run_cli(["domain", "start", "t-web", "--wait", "5", *sock], capsys)
    assert code == 0 and out["started"] == ["t-db", "t-web"] and db.isActive() and web.isActive()
    code, out, _ = run_cli(["domain", "stop", "t-db", "--wait", "5", *sock], capsys)
    assert code == 0 and out["stopped"] == ["t-web", "t-db"] and not web.isActive()


def test_help_documents_every_command():
    parser = argparse.ArgumentParser(prog="vmsched")
    sub = parser.add_subparsers(dest="command")
    register(sub, serve)
    text = {name: p.format_help() for name, p in sub.choices.items()}
    assert "--dedicated-pool CPUSET" in text["agent"] and "--release-on-stop" in text["agent"]
    set_help = sub.choices["policy"]._subparsers._group_actions[0].choices["set"].format_help()
    for opt in ("--pin VCPU=CPUSET", "--emulator-pin", "--dedicated N|CPUSET", "--weight SHARES", "--cap PERCENT",
                "--quota US", "--period US", "--requires GUEST", "--file POLICY.yaml"):
        assert opt in set_help


# --- bus (embedded transport) and gateway ---------------------------------------------------------
def test_bus_rpc_and_events(conn, make_agent):
    from vmsched.bus import RequestError
    from vmsched.bus.rpc import call
    from vmsched.bus.topology import agent_queue

    a = make_agent(amqp_url="memory://")
    dom = guest(conn, "t-bus")
    assert a._bus.worker.ready.wait(5)
    view = call("memory://", agent_queue("h1"), "set_policy", {"guest": "t-bus", "policy": {"dedicated": 2}})
    assert view["allocation"] == "4-5" and live_pins(dom) == {0: "4", 1: "5"}
    with pytest.raises(RequestError, match="^not_found: no guest"):
        call("memory://", agent_queue("h1"), "get_policy", {"guest": "t-gone"})
    with pytest.raises(RequestError, match="^invalid: "):
        call("memory://", agent_queue("h1"), "set_pool", {"dedicated_pool": "0-7"})
    wait_until(lambda: any(e == "applied" and b["guest"] == "t-bus" for e, b in a.events))


class _DirectBus:
    """The gateway's bus client, delivering straight to the agent's bus handler."""

    def __init__(self, agent, down: bool = False):
        self.agent, self.down = agent, down

    async def call(self, queue, op, body, timeout):
        from vmsched.bus import BusUnavailable

        if self.down:
            raise BusUnavailable("message bus unavailable: connection refused")
        assert queue == "vmsched.agent.h1"
        return self.agent._bus._handle(Envelope(op=op, deadline=0, body=body))


def test_gateway_router(conn, make_agent):
    from vmsched.gateway.agent_api import router

    a = make_agent(amqp_url="memory://")
    guest(conn, "t-gw")
    app = FastAPI()
    app.include_router(router)
    app.state.bus = _DirectBus(a)
    http = TestClient(app)
    r = http.put("/v1/hosts/h1/policies/t-gw", json={"dedicated": 2, "weight": 100})
    assert r.status_code == 200 and r.json()["allocation"] == "4-5"
    assert http.get("/v1/hosts/h1/policies/t-gw").json()["policy"] == {"dedicated": 2, "weight": 100}
    assert [p["guest"] for p in http.get("/v1/hosts/h1/policies").json()["policies"]] == ["t-gw"]
    assert http.get("/v1/hosts/h1/cpus").json()["allocations"] == {"t-gw": "4-5"}
    r = http.get("/v1/hosts/h1/policies/t-nobody")
    assert r.status_code == 404 and r.json()["detail"]["code"] == "not_found"
    r = http.put("/v1/hosts/h1/policies/t-gw", json={"dedicated": 7})
    assert r.status_code == 400 and "asks for 7 dedicated CPUs" in r.json()["detail"]["error"]
    assert http.put("/v1/hosts/h1/policies/t-gw", json={"weight": 1}).status_code == 422
    assert http.put("/v1/hosts/h1/cpus", json={"dedicated_pool": "6-7"}).json()["allocations"] == {"t-gw": "6-7"}
    assert http.delete("/v1/hosts/h1/policies/t-gw").json()["deleted"] is True
    assert http.get("/v1/hosts/bad$host/cpus").status_code == 422
    app.state.bus = _DirectBus(a, down=True)
    assert http.get("/v1/hosts/h1/cpus").status_code == 503


def test_agent_daemon_process(state_dir):  # noqa: F811 - fixture
    import os
    import signal
    import subprocess
    import sys

    sock = state_dir / "a.sock"
    base = [sys.executable, "-m", "vmsched.cli"]
    env = {**os.environ, "VMSCHED_AGENT_AMQP": "", "VMSCHED_AMQP_URL": ""}
    proc = subprocess.Popen([*base, "agent", "--libvirt", "test:///default", "--host-id", "hd", "--state-dir",
                             str(state_dir), "--socket", str(sock), "--dedicated-pool", "6-7"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, timeout=20)
        assert proc.poll() is None
        out = subprocess.run([*base, "policy", "set", "test", "--dedicated", "2", "--socket", str(sock)],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["allocation"] == "6-7"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not sock.exists()
        assert json.loads((state_dir / "checkpoint.json").read_text())["checkpoint"]["pool"] == "6-7"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    # a pool that cannot exist: refused at start with the reason, exit 1
    bad = subprocess.run([*base, "agent", "--libvirt", "test:///default", "--host-id", "hd", "--state-dir",
                          str(state_dir / "b"), "--socket", str(state_dir / "b.sock"), "--dedicated-pool", "0-9"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert bad.returncode == 1 and "CPUs 8-9 do not exist on this host" in bad.stderr
