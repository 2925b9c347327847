"""The agent's interfaces: local socket, CLI, bus RPC (embedded bus) and the gateway's /v1/hosts router."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import socket

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from vmsched.services.policy_agent.serve import serve
from vmsched.services.policy_agent.surfaces.cli import register
from vmsched.services.policy_agent.errors import GuestNotFound, PolicyError
from vmsched.services.policy_agent.surfaces.client import SocketClient
from tests.support.waiting import wait_until
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.agent_driver import guest, live_pins
from vmsched.bus.inprocess import InProcessTransport


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
    # raw wire: several requests on one connection, garbage
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(a.socket_path))
        f = s.makefile("rwb")
        f.write(b'{"v": 2, "op": "check_start", "body": {"guest": "t-sock", "uuid": null}}\nnot json\n'
                b'{"v": 2, "op": "list_policies", "body": {}}\n')
        f.flush()
        first, second, third = (json.loads(f.readline()) for _ in range(3))
    assert first["ok"] and first["body"]["allowed"] is True
    assert second == {"v": 2, "ok": False, "error": second["error"], "code": "invalid", "details": [], "body": {}}
    assert [p["guest"] for p in third["body"]["policies"]] == ["t-sock"]


@pytest.mark.parametrize("name, reason", [
    ("t-sock\x00x", "control character U+0000 at position 6"),
    ("t\nsock", "control character U+000A at position 1"),
    ("t-\ud800", "lone surrogate U+D800 at position 2"),
    ("x" * 257, "257 characters long; at most 256"),
    (" ", "empty guest name"),
])
def test_socket_refuses_invalid_guest_names(conn, make_agent, caplog, name, reason):
    """A NUL (or other invalid character) in a guest name is a refusal with a reason, not a traceback."""
    a = make_agent()
    guest(conn, "t-sock")
    client = SocketClient(a.socket_path)
    for op, body in (("get_policy", {"guest": name}), ("set_policy", {"guest": name, "policy": {}}),
                     ("delete_policy", {"guest": name}), ("start_domain", {"guest": name}),
                     ("set_policy", {"guest": "t-sock", "policy": {"requires": [name]}})):
        with pytest.raises(PolicyError, match=re.escape(reason)):
            client.call(op, body)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


def test_socket_versions(conn, make_agent):
    """The socket speaks the agent's contract version only (the CLI and the hook are installed with it): another
    version, or none, is refused by name; a request without a body is malformed."""
    a = make_agent()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(a.socket_path))
        f = s.makefile("rwb")
        f.write(b'{"v": 2, "op": "ping", "body": {}}\n{"op": "ping", "body": {}}\n{"v": 3, "op": "ping", "body": {}}\n'
                b'{"v": "x", "op": "ping", "body": {}}\n{"v": 2, "op": "get_policy", "guest": "test"}\n')
        f.flush()
        v2, none, v3, bad, flat = (json.loads(f.readline()) for _ in range(5))
    assert v2["ok"] and v2["body"]["host_id"] == "h1"
    assert not none["ok"] and none["code"] == "unsupported_version" and "contract version None" in none["error"]
    assert not v3["ok"] and v3["code"] == "unsupported_version" and "contract version 3" in v3["error"]
    assert not bad["ok"] and bad["code"] == "unsupported_version"
    assert not flat["ok"] and flat["code"] == "invalid" and '"body"' in flat["error"]


# --- CLI ---------------------------------------------------------------------------------
def test_cli_policy_commands(conn, make_agent, capsys, tmp_path):
    a = make_agent()
    dom = guest(conn, "t-cli")
    sock = ["--socket", str(a.socket_path)]
    code, out, _ = run_cli(["policy", "set", "t-cli", "--pin", "0=1", "--pin", "1=2-3,^3", "--weight", "500",
                            "--cap", "50", "--json", *sock], capsys)
    assert code == 0 and out["policy"] == {"vcpu_pins": {"0": "1", "1": "2"}, "weight": 500, "cap_percent": 50.0}
    assert live_pins(dom) == {0: "1", 1: "2"}
    code, out, _ = run_cli(["policy", "set", "t-cli", "--merge", "--emulator-pin", "0", "--json", *sock], capsys)
    assert code == 0 and out["policy"]["weight"] == 500 and out["policy"]["emulator_pin"] == "0"
    f = tmp_path / "p.yaml"
    f.write_text("guest: t-cli\npolicy:\n  dedicated: 2\n  requires: [t-other]\n")
    code, out, _ = run_cli(["policy", "set", "t-cli", "--file", str(f), "--json", *sock], capsys)
    assert code == 0 and out["allocation"] == "4-5" and out["warnings"]
    code, out, _ = run_cli(["policy", "get", "t-cli", "--json", *sock], capsys)
    assert out["policy"] == {"dedicated": 2, "requires": ["t-other"]}
    code, out, _ = run_cli(["policy", "list", "--json", *sock], capsys)
    assert [p["guest"] for p in out["policies"]] == ["t-cli"]
    parser = argparse.ArgumentParser(prog="vmsched")  # without --json: a table for people
    register(parser.add_subparsers(dest="command", required=True), serve)
    parsed = parser.parse_args(["policy", "list", *sock])
    assert parsed.func(parsed) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["GUEST", "STATE", "STATUS", "POLICY", "ALLOCATION", "ERROR"]
    assert lines[1].split()[0] == "t-cli" and "dedicated=2 requires=t-other" in lines[1] and "4-5" in lines[1]
    parsed = parser.parse_args(["policy", "get", "t-cli", *sock])
    assert parsed.func(parsed) == 0
    shown = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert shown["policy"] == "dedicated=2 requires=t-other" and shown["allocation"] == "4-5"
    code, out, _ = run_cli(["policy", "cpus", "--json", *sock], capsys)
    assert out["free"] == "6-7"
    parsed = parser.parse_args(["policy", "cpus", *sock])  # a drawing by default
    assert parsed.func(parsed) == 0
    drawn = capsys.readouterr().out
    assert "free 6-7" in drawn.splitlines()[0] and "[4 t-cli vcpu0]" in drawn and "[5 t-cli vcpu1]" in drawn
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
    assert "--socket PATH or env VMSCHED_AGENT_SOCKET" in err  # what to do about it
    code, _, err = run_cli(["policy", "list", "--amqp", "memory://"], capsys)
    assert code == 2 and "--amqp needs --host" in err
    code, out, _ = run_cli(["policy", "pool", "6-7", "--json", *sock], capsys)
    assert code == 0 and out["allocations"] == {"t-cli": "6-7"}
    code, out, _ = run_cli(["policy", "delete", "t-cli", "--json", *sock], capsys)
    assert code == 0 and out["deleted"] is True


def test_cli_set_prints_what_a_person_reads(conn, make_agent, capsys):
    """``policy set`` prints the guest as ``policy get`` does (a table; the reply with --json), and warnings, each
    a sentence, are separated so that they read as sentences."""
    a = make_agent()
    guest(conn, "t-people")
    sock = ["--socket", str(a.socket_path)]
    parser = argparse.ArgumentParser(prog="vmsched")
    register(parser.add_subparsers(dest="command", required=True), serve)
    warned = ("required guest 't-x' is not defined on this host (yet); "
              "required guest 't-y' is not defined on this host (yet)")
    for argv in (["policy", "set", "t-people", "--requires", "t-x", "--requires", "t-y", *sock],
                 ["policy", "get", "t-people", *sock]):
        parsed = parser.parse_args(argv)
        assert parsed.func(parsed) == 0
        out = capsys.readouterr().out
        with pytest.raises(ValueError):
            json.loads(out)  # a table, not the reply
        shown = dict(line.split(None, 1) for line in out.splitlines())
        assert shown["guest"].startswith("t-people (") and shown["policy"] == "requires=t-x,t-y"
        assert shown["warnings"] == warned, out
    code, out, _ = run_cli(["policy", "set", "t-people", "--weight", "300", "--json", *sock], capsys)
    assert code == 0 and out["policy"] == {"weight": 300}


def test_cli_domain_start_stop(conn, make_agent, capsys):
    a = make_agent()
    db, web = guest(conn, "t-db", start=False), guest(conn, "t-web", start=False)
    a.set_policy("t-web", {"requires": ["t-db"]})
    sock = ["--socket", str(a.socket_path)]
    code, out, _ = run_cli(["domain", "start", "t-web", "--wait", "5", "--json", *sock], capsys)
    assert code == 0 and out["started"] == ["t-db", "t-web"] and db.isActive() and web.isActive()
    code, out, _ = run_cli(["domain", "stop", "t-db", "--wait", "5", "--json", *sock], capsys)
    assert code == 0 and out["stopped"] == ["t-web", "t-db"] and not web.isActive()


def test_every_command_prints_text_for_people(conn, make_agent, capsys):
    """Without --json every client command prints what a person reads, never the reply's JSON."""
    a = make_agent()
    guest(conn, "t-db", start=False), guest(conn, "t-web", start=False)
    a.set_policy("t-web", {"requires": ["t-db"], "dedicated": 2})
    sock = ["--socket", str(a.socket_path)]

    def text(*argv: str, code: int = 0) -> str:
        parser = argparse.ArgumentParser(prog="vmsched")
        register(parser.add_subparsers(dest="command", required=True), serve)
        args = parser.parse_args([*argv, *sock])
        assert args.func(args) == code
        out = capsys.readouterr().out
        with pytest.raises(ValueError):
            json.loads(out)  # text, not the reply
        return out

    assert text("policy", "check-start", "t-db") == "guest 't-db' has no start requirements\n"
    assert text("domain", "start", "t-web", "--wait", "5") == "started: t-db, t-web\nalready running: -\n"
    assert text("domain", "stop", "t-db", "--wait", "5") == "stopped: t-web, t-db\nalready stopped: -\n"
    assert re.fullmatch(r"checked 3 guests in [0-9.]+ s, repaired 0\n", text("policy", "reconcile"))  # and 'test'
    drawn = text("policy", "pool", "6-7")
    assert "dedicated pool 6-7, free -" in drawn.splitlines()[0] and "[6 t-web vcpu0]" in drawn
    shown = dict(line.split(None, 1) for line in text("policy", "explain", "t-web").splitlines())
    assert shown["policy"] == "dedicated=2 requires=t-db" and shown["decisions:"] == "-"
    assert text("policy", "delete", "t-web") == "policy of 't-web' deleted: its CPUs released, its pins reset\n"
    assert text("policy", "delete", "t-web") == "guest 't-web' has no policy: nothing to delete\n"


def test_help_documents_every_command():
    parser = argparse.ArgumentParser(prog="vmsched")
    sub = parser.add_subparsers(dest="command")
    register(sub, serve)
    text = {name: p.format_help() for name, p in sub.choices.items()}
    assert "--dedicated-pool CPUSET" in text["agent"] and "--release-on-stop" in text["agent"]
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        parser.parse_args(["policy", "set", "--help"])
    set_help = out.getvalue()
    for opt in ("--pin VCPU=CPUSET", "--emulator-pin", "--dedicated N|CPUSET", "--weight SHARES", "--cap PERCENT",
                "--quota US", "--period US", "--requires GUEST", "--file POLICY.yaml"):
        assert opt in set_help


# --- bus (in-process transport) and gateway ---------------------------------------------------------
def test_bus_rpc_and_events(conn, make_agent):
    from vmsched.bus import RequestError
    from vmsched.bus.topology import agent_queue

    bus = InProcessTransport()  # the in-process bus, handed to the agent and to its caller
    a = make_agent(transport=bus)
    dom = guest(conn, "t-bus")
    assert bus.call(agent_queue("h1"), "ping", {}, timeout=10) == {"service": "agent"}  # it consumes its queue
    view = bus.call(agent_queue("h1"), "set_policy", {"guest": "t-bus", "policy": {"dedicated": 2}})
    assert view["allocation"] == "4-5" and live_pins(dom) == {0: "4", 1: "5"}
    with pytest.raises(RequestError, match="^no guest") as missing:
        bus.call(agent_queue("h1"), "get_policy", {"guest": "t-gone"})
    assert missing.value.code == "not_found"
    with pytest.raises(RequestError) as refused:
        bus.call(agent_queue("h1"), "set_pool", {"dedicated_pool": "0-15"})  # every host CPU
    assert refused.value.code == "invalid" and refused.value.details
    with pytest.raises(RequestError, match="control character U\\+0000") as nul:  # on the bus
        bus.call(agent_queue("h1"), "get_policy", {"guest": "t-bus\x00"})
    assert nul.value.code == "invalid"
    wait_until(lambda: any(e == "applied" and b["guest"] == "t-bus" for e, b in a.events))


@pytest.fixture
def gateway():
    """The gateway's /v1/hosts router on an agent's in-process bus, through the gateway's own client of it, with the
    gateway's answer to an invalid request."""
    from fastapi.exceptions import RequestValidationError

    from vmsched.gateway.agent_api import router
    from vmsched.gateway.strict_json import invalid_request

    opened: list[TestClient] = []

    def make(bus: InProcessTransport) -> tuple[FastAPI, TestClient]:
        client = bus.client()

        @contextlib.asynccontextmanager
        async def lifespan(_app):
            await client.start()
            yield
            await client.close()

        app = FastAPI(lifespan=lifespan)
        app.include_router(router)
        app.add_exception_handler(RequestValidationError, invalid_request)
        app.state.bus = client
        opened.append(TestClient(app).__enter__())  # the lifespan runs: the client starts in the app's loop
        return app, opened[-1]

    yield make
    for http in opened:
        http.__exit__(None, None, None)


def test_gateway_router(conn, make_agent, gateway):
    bus = InProcessTransport()
    make_agent(transport=bus)
    guest(conn, "t-gw")
    app, http = gateway(bus)
    r = http.put("/v1/hosts/h1/policies/t-gw", json={"dedicated": 2, "weight": 100})
    assert r.status_code == 200 and r.json()["allocation"] == "4-5"
    assert http.get("/v1/hosts/h1/policies/t-gw").json()["policy"] == {"dedicated": 2, "weight": 100}
    assert [p["guest"] for p in http.get("/v1/hosts/h1/policies").json()["policies"]] == ["t-gw"]
    assert http.get("/v1/hosts/h1/cpus").json()["allocations"] == {"t-gw": "4-5"}
    r = http.get("/v1/hosts/h1/policies/t-nobody")
    assert r.status_code == 404 and r.json()["detail"]["code"] == "not_found"
    r = http.put("/v1/hosts/h1/policies/t-gw", json={"dedicated": 7})
    assert r.status_code == 400 and "asks for 7 dedicated CPUs" in r.json()["detail"]["error"]
    assert http.put("/v1/hosts/h1/cpus", json={"dedicated_pool": "6-7"}).json()["allocations"] == {"t-gw": "6-7"}
    assert http.delete("/v1/hosts/h1/policies/t-gw").json()["deleted"] is True
    r = http.get("/v1/hosts/bad$host/cpus")
    assert r.status_code == 400 and r.json()["detail"]["code"] == "invalid" and "host" in r.json()["detail"]["error"]
    app.state.bus = bus.client()  # a client that never connected: the bus is down
    assert http.get("/v1/hosts/h1/cpus").status_code == 503


def test_gateway_answers_every_invalid_request_with_400_and_every_reason(conn, make_agent, gateway):
    """A malformed body (pydantic) and an agent's refusal are both 400, each reason listed."""
    bus = InProcessTransport()
    make_agent(transport=bus)
    guest(conn, "t-gw")
    app, http = gateway(bus)
    # the shape, checked by the gateway: every problem at once, nothing sent to the agent
    r = http.put("/v1/hosts/h1/policies/t-gw", json={"weight": "heavy", "bogus": 1, "requires": ["db\u0000"]})
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert detail["code"] == "invalid" and detail["host"] == "h1"
    assert len(detail["details"]) == 3
    assert any(d.startswith("weight:") for d in detail["details"])
    assert any(d.startswith("bogus:") for d in detail["details"])
    assert any("requires.0" in d and "U+0000" in d for d in detail["details"])
    r = http.put("/v1/hosts/h1/policies/t-gw", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["detail"]["details"]
    # the values, checked by the agent: also 400, with its reasons
    r = http.put("/v1/hosts/h1/policies/t-gw", json={"weight": 1, "dedicated": 9})
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert any("weight (cpu_shares) 1 outside" in d for d in detail["details"])
    assert detail["error"] == "; ".join(detail["details"])
    # the OpenAPI document says so (400 with the error model; no 422)
    spec = app.openapi()["paths"]["/v1/hosts/{host}/policies/{guest}"]["put"]
    assert "400" in spec["responses"] and "422" not in spec["responses"]
    assert spec["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/PolicyDocument")


def test_a_huge_cpu_set_is_refused_before_it_is_parsed(conn, make_agent, gateway):
    """A 1 MB CPU set (every item valid, each spanning every CPU libvirt knows) is refused by its length, with
    one line saying so, on the socket, on the bus, at the gateway and by the model; nothing is applied."""
    from vmsched.bus.topology import agent_queue
    from vmsched.services.policy_agent.policy.model import parse_policy

    huge = ",".join(["0-16383"] * 125000)  # 1 MB
    said = f"is {len(huge):,} characters long; at most 65,536 are accepted"
    bus = InProcessTransport()
    a = make_agent(transport=bus)
    guest(conn, "t-huge")
    client = SocketClient(a.socket_path)
    for policy in ({"vcpu_pins": {"0": huge}}, {"emulator_pin": huge}, {"dedicated": huge}):
        with pytest.raises(PolicyError) as exc:
            client.call("set_policy", {"guest": "t-huge", "policy": policy})
        assert said in str(exc.value) and "\n" not in str(exc.value) and len(str(exc.value)) < 300
        with pytest.raises(PolicyError, match=said):
            parse_policy(policy)
        with pytest.raises(Exception, match=said):
            bus.call(agent_queue("h1"), "set_policy", {"guest": "t-huge", "policy": policy}, timeout=10)
    with pytest.raises(PolicyError, match=said):
        client.call("set_pool", {"dedicated_pool": huge})
    _, http = gateway(bus)
    r = http.put("/v1/hosts/h1/policies/t-huge", json={"vcpu_pins": {"0": huge}})
    assert r.status_code == 400 and said in r.json()["detail"]["error"]
    assert a.get_policy("t-huge")["policy"] is None and a.cpus()["dedicated_pool"] == "4-7"


@pytest.mark.parametrize("path, reason", [
    ("/v1/hosts/h1/policies/t-gw%00", "control character U+0000"),
    ("/v1/hosts/h1/policies/t%0Agw", "control character U+000A"),
    ("/v1/hosts/h1/policies/" + "x" * 300, "300 characters long"),
])
def test_gateway_refuses_invalid_guest_names(conn, make_agent, gateway, caplog, path, reason):
    """A bad guest name at the gateway: 400 with the reason for every route taking a guest; no traceback anywhere."""
    bus = InProcessTransport()
    make_agent(transport=bus)
    _, http = gateway(bus)
    domain = path.replace("/policies/", "/domains/")
    for r in (http.get(path), http.put(path, json={}), http.delete(path), http.post(domain + "/start"),
              http.post(domain + "/stop")):
        assert r.status_code == 400, (r.request.method, r.request.url, r.text)
        assert reason in r.json()["detail"]["error"]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


def test_agent_daemon_process(state_dir):  # noqa: F811 - fixture
    import os
    import signal
    import subprocess
    import sys

    sock = state_dir / "a.sock"
    base = [sys.executable, "-m", "vmsched.cli"]
    env = {**os.environ, "VMSCHED_AGENT_AMQP": "", "VMSCHED_AMQP_URL": ""}
    proc = subprocess.Popen([*base, "agent", "--libvirt", "test:///default", "--host-id", "hd", "--state-dir",
                             str(state_dir), "--socket", str(sock), "--dedicated-pool", "6-7",
                             "--lock-dir", str(state_dir / "lock")],  # test:///default: one lock per test
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, timeout=20)
        assert proc.poll() is None
        out = subprocess.run([*base, "policy", "set", "test", "--dedicated", "2", "--json", "--socket", str(sock)],
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
                          str(state_dir / "b"), "--socket", str(state_dir / "b.sock"), "--dedicated-pool", "0-17"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert bad.returncode == 1 and "CPUs 16-17 do not exist on this host" in bad.stderr
