"""A start that cannot work fails before any service starts, with one `vmsched: error:` line saying what to do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.net import free_port
from tests.support.paths import ROOT

STARTED = ("all-in-one on", "running (bus", "Uvicorn running", " INFO ")


def vmsched(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "VMSCHED_METRICS_PORT": "0", **(env or {})})


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vmsched: error: "), out.stderr
    assert not any(mark in out.stderr for mark in STARTED)
    return lines[0]


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("command", ["run", "gateway"])
def test_a_busy_port_fails_before_anything_starts(command: str, busy_port: int):
    line = one_error_line(vmsched(command, "--port", str(busy_port), "--amqp", "memory://"))
    assert f"the gateway cannot listen on 127.0.0.1:{busy_port}: Address already in use; " in line
    assert "a vmsched started before: stop it (Ctrl-C where it runs)" in line
    assert line.endswith("or choose another port with --port PORT (VMSCHED_PORT)")


def test_a_busy_metrics_port_says_which_option_to_change(busy_port: int):
    out = vmsched("run", "--port", str(free_port()), env={"VMSCHED_METRICS_PORT": str(busy_port)})
    line = one_error_line(out)
    assert f"the metrics listener cannot listen on 127.0.0.1:{busy_port}: Address already in use; " in line
    assert line.endswith("or choose another port with --metrics-port PORT (VMSCHED_METRICS_PORT)")


def test_a_missing_tokens_file_says_how_to_make_one(tmp_path: Path):
    line = one_error_line(vmsched("run", "--port", str(free_port()), "--tokens-file", str(tmp_path / "tokens.yaml")))
    assert f"tokens file {tmp_path / 'tokens.yaml'} does not exist" in line and "vmsched token new" in line


def test_a_missing_plugins_folder(tmp_path: Path):
    line = one_error_line(vmsched("scoring", "--plugins", str(tmp_path / "none"), "--amqp", "memory://"))
    assert f"plugins folder {tmp_path / 'none'} does not exist" in line


@pytest.mark.skipif(os.geteuid() != 0, reason="the plugin user is only switched to when the service runs as root")
def test_a_plugins_folder_the_plugin_user_cannot_read(tmp_path: Path):
    private = tmp_path / "private"
    (private / "plugins").mkdir(parents=True)
    private.chmod(0o700)
    line = one_error_line(vmsched("run", "--port", str(free_port()), "--plugins", str(private / "plugins"),
                                  env={"VMSCHED_ALLOW_ROOT_PLUGINS": "false"}))  # the suite's default allows root
    assert "plugin workers run as user" in line and f"cannot read the plugins folder {private / 'plugins'}" in line
    assert "--plugin-user" in line
