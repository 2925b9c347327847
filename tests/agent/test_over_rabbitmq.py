"""The policy agent as its own process on RabbitMQ, reached through the gateway and the CLI.

The agent drives libvirt's test driver here (the real-QEMU behaviour is in
tests/e2e/libvirt); what this proves is the cross-process path: gateway
/v1/hosts/... -> AMQP agent queue -> agent -> reply, the CLI over the bus,
and the agent's events on the vmsched.events topic exchange.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.agents import EventTap
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.stack import AUTH, Proc, Stack
from tests.support.waiting import wait_until
from vmsched.facts.model import FACTS_VERSION
from vmsched.messages import CONTRACT_VERSION

pytestmark = pytest.mark.rabbitmq

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")


def test_agent_policies_through_gateway_cli_and_events(tmp_path: Path, rabbit_vhost: str):
    host = "hv-rmq"
    tap = EventTap(rabbit_vhost, f"agent.{host}.*")
    env = {"VMSCHED_AGENT_AMQP": "", "VMSCHED_AMQP_URL": ""}
    url_file = tmp_path / "amqp-url"
    url_file.write_text(rabbit_vhost + "\n")
    # the broker password never on a command line: the agent from a file, the gateway from the environment
    agent = Proc(["agent", "--libvirt", "test:///default", "--host-id", host, "--amqp-url-file", str(url_file),
                  "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "agent.sock"),
                  "--dedicated-pool", "6-7", "--lock-dir", str(tmp_path / "lock")], tmp_path / "agent.log", env=env).start()
    port = free_port()
    gateway = Proc(["gateway", "--port", str(port)], tmp_path / "gateway.log",
                   env={"VMSCHED_AMQP_URL": rabbit_vhost}).start()
    stack = Stack(port, tmp_path, [gateway, agent])
    url = f"{stack.url}/v1/hosts/{host}"
    try:
        wait_until(lambda: _status(f"{url}/cpus") == 200, 60, 0.2, "the agent to answer through the gateway")
        cpus = httpx.get(f"{url}/cpus", timeout=10, headers=AUTH).json()
        assert "6-7" in json.dumps(cpus)

        r = httpx.put(f"{url}/policies/test", json={"dedicated": 2, "weight": 512}, timeout=10, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["allocation"] == "6-7"
        got = httpx.get(f"{url}/policies/test", timeout=10, headers=AUTH).json()
        assert got["policy"]["dedicated"] == 2 and got["policy"]["weight"] == 512

        refused = httpx.put(f"{url}/policies/test", json={"dedicated": 3}, timeout=10, headers=AUTH)
        assert refused.status_code == 400 and "pool" in json.dumps(refused.json()).lower()
        assert httpx.get(f"{url}/policies/no-such-guest", timeout=10, headers=AUTH).status_code == 404
        # a bad guest name and a bad body through the real gateway and bus: 400 with every reason, never a 502
        nul = httpx.get(f"{url}/policies/test%00", timeout=10, headers=AUTH)
        assert nul.status_code == 400 and "U+0000" in nul.json()["detail"]["error"]
        bad = httpx.put(f"{url}/policies/test", json={"weight": 1, "cap_percent": 500}, timeout=10, headers=AUTH)
        assert bad.status_code == 400 and len(bad.json()["detail"]["details"]) == 2, bad.text

        out = subprocess.run([sys.executable, "-m", "vmsched.cli", "policy", "list", "--amqp-url-file", str(url_file),
                              "--host", host], cwd=ROOT, capture_output=True, text=True, timeout=30,
                             env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        assert "test" in out.stdout
        out = subprocess.run([sys.executable, "-m", "vmsched.cli", "policy", "get", "te\nst", "--amqp-url-file", str(url_file),
                              "--host", host], cwd=ROOT, capture_output=True, text=True, timeout=30,
                             env={**os.environ, **env})
        assert out.returncode == 1 and "control character U+000A" in out.stderr, out.stderr
        refused = subprocess.run([sys.executable, "-m", "vmsched.cli", "policy", "list", "--amqp", rabbit_vhost,
                                  "--host", host], cwd=ROOT, capture_output=True, text=True, timeout=30,
                                 env={**os.environ, **env})
        assert refused.returncode == 2 and "--amqp-url-file" in refused.stderr and "VMSCHED_AMQP_URL" in refused.stderr
        assert ":guest@" not in refused.stderr and ":***@" in refused.stderr

        wait_until(lambda: (f"agent.{host}.applied", "test", "set") in
                   [(key, e.get("guest"), e.get("trigger")) for key, e in tap.events],
                   15, 0.1, "the agent's applied event on the topic exchange")
        # every event carries its version; facts have a version of their own
        assert all(e.get("v") == (FACTS_VERSION if key.endswith(".facts") else CONTRACT_VERSION)
                   for key, e in tap.events)

        assert httpx.delete(f"{url}/policies/test", timeout=10, headers=AUTH).status_code == 200
        assert httpx.get(f"{url}/policies/test", timeout=10, headers=AUTH).json().get("policy") in (None, {})
        assert httpx.get(f"{stack.url}/v1/hosts/unknown-host/cpus", timeout=30, headers=AUTH).status_code == 504
        for proc in (agent, gateway):
            assert ":guest@" not in proc.output()  # never the broker password in a log line
    finally:
        tap.close()
        stack.stop()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5, headers=AUTH).status_code
    except httpx.HTTPError:
        return 0
