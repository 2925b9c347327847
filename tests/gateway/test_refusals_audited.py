"""Every refusal is audited, log-ins included; an engine allow-list that lists nothing refuses to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.stack import Proc, console_login
from vmsched.config import Settings
from vmsched.tokens import digest


def audit_lines(proc: Proc) -> list[dict]:
    return [json.loads(line) for line in proc.output().splitlines()
            if line.startswith("{") and '"vmsched.audit"' in line]


def test_refused_logins_are_audited(tmp_path: Path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"tokens:\n- name: ops\n  roles: [operate]\n  sha256: {digest('ops-token')}\n")
    port = free_port()
    proc = Proc(["gateway", "--amqp", f"amqp://127.0.0.1:{free_port()}//", "--connect-timeout", "0.5",
                 "--port", str(port), "--tokens-file", str(tokens), "--metrics-port", "0", "--log-format", "json"],
                tmp_path / "gateway.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/healthz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.popen.poll() is None, proc.output()
                time.sleep(0.1)
        with httpx.Client(base_url=url) as browser:  # the login form's CSRF token and its cookie
            assert console_login(browser, "wrong").status_code == 401
            assert console_login(browser, "ops-token").status_code == 403  # no read role
        deadline = time.monotonic() + 10
        while len([a for a in audit_lines(proc) if a["route"] == "/login"]) < 2:
            assert time.monotonic() < deadline, proc.output()
            time.sleep(0.1)
        refused = [(a["method"], a["route"], a["status"], a["outcome"], a["role"])
                   for a in audit_lines(proc) if a["route"] == "/login"]
        assert refused == [("POST", "/login", 401, "unauthenticated", "read"), ("POST", "/login", 403, "forbidden", "read")]
        assert [a["who"] for a in audit_lines(proc) if a["route"] == "/login"] == [None, "ops"]
        assert "ops-token" not in proc.output() and "wrong" not in proc.output()
    finally:
        proc.kill()


@pytest.mark.parametrize("value", [",", " , ,", " ", "\t", "  ,  "])
@pytest.mark.parametrize("via", ["flag", "environment"])
def test_an_allow_list_that_lists_nothing_refuses_to_start(value: str, via: str):
    """Blanks or commas alone are a list given but empty, not the "any client" of an unset one."""
    with pytest.raises(ValueError, match="lists no network"):
        Settings(engine_allow=value)
    args, env = (["--engine-allow", value], {}) if via == "flag" else ([], {"VMSCHED_ENGINE_ALLOW": value})
    out = subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", "gateway", "--amqp", "memory://",
                          "--port", str(free_port()), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "VMSCHED_METRICS_PORT": "0", **env})
    assert out.returncode == 2, out.stderr
    assert "lists no network" in out.stderr and "Traceback" not in out.stderr
    assert "Started server process" not in out.stderr


def test_an_unset_or_empty_allow_list_means_any_client():
    assert Settings(engine_allow="").engine_networks == []
    assert Settings().engine_allow == ""
