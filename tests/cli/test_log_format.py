"""One log format per process (--log-format text|json), and each plugin load logged once in the all-in-one."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx

from tests.support.net import free_port
from tests.support.paths import TEST_PLUGINS
from tests.support.stack import Proc
from vmsched.tokens import digest


def start(tmp_path: Path, *args: str) -> tuple[Proc, str]:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"tokens:\n- name: ops\n  roles: [read]\n  sha256: {digest('ops-token')}\n")
    port = free_port()
    proc = Proc([*args, "--port", str(port), "--tokens-file", str(tokens), "--metrics-port", "0"],
                tmp_path / "vmsched.log").start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and proc.popen.poll() is None, proc.output()
        time.sleep(0.1)


def wait_for(proc: Proc, text: str) -> None:
    deadline = time.monotonic() + 10
    while text not in proc.output():
        assert time.monotonic() < deadline, proc.output()
        time.sleep(0.1)


def test_text_log_of_the_all_in_one(tmp_path: Path):
    proc, url = start(tmp_path, "run", "--plugins", str(TEST_PLUGINS))
    try:
        assert httpx.get(url + "/v1/units", headers={"Authorization": "Bearer wrong"}).status_code == 401
        wait_for(proc, "vmsched.audit: audit ")
        lines = proc.output().splitlines()
        assert not [line for line in lines if line.startswith("{")]  # no JSON line in a text log
        assert not [line for line in lines if line.startswith("INFO:")]  # uvicorn's too
        audit = next(line for line in lines if "vmsched.audit: audit " in line)
        assert "route=/v1/units operation=units status=401 outcome=unauthenticated" in audit and "via=none" in audit
        loads = [m.group(1) for m in map(re.compile(r"plugin (\w+) (?:loaded|failed to load)").search, lines) if m]
        assert loads and len(loads) == len(set(loads)), loads  # each plugin once, not once per service
    finally:
        proc.kill()


def test_json_log_of_the_gateway(tmp_path: Path):
    proc, url = start(tmp_path, "gateway", "--amqp", f"amqp://127.0.0.1:{free_port()}//", "--connect-timeout", "0.5",
                      "--log-format", "json")
    try:
        assert httpx.get(url + "/v1/units", headers={"Authorization": "Bearer wrong"}).status_code == 401
        wait_for(proc, '"event": "vmsched.audit"')
        records = [json.loads(line) for line in proc.output().splitlines()]  # every line is JSON
        audit = next(r for r in records if r.get("event") == "vmsched.audit")
        assert (audit["route"], audit["status"], audit["outcome"], audit["who"]) == ("/v1/units", 401,
                                                                                    "unauthenticated", None)
        assert any(r.get("logger") == "uvicorn.error" for r in records)
    finally:
        proc.kill()
