"""The agent's metrics listener can require a read-role token, like the gateway's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.stack import AUTH
from tests.support.waiting import wait_until
from vmsched.tokens import digest


def test_agent_metrics_need_a_read_token_when_asked(tmp_path: Path, test_tokens_file: Path) -> None:
    schedule_only = "vmsched-test-schedule-only"
    tokens = tmp_path / "metrics-tokens.yaml"
    tokens.write_text(test_tokens_file.read_text()
                      + f"  - name: scheduler\n    roles: [schedule]\n    sha256: {digest(schedule_only)}\n")
    port = free_port()
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "vmsched.cli", "agent", "--libvirt", "test:///default",
         "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "agent.sock"),
         "--lock-dir", str(tmp_path / "lock"), "--metrics-port", str(port), "--metrics-tokens-file", str(tokens)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                assert proc.poll() is None, (tmp_path / "agent.log").read_text()
                return False

        wait_until(up, timeout=30, what="the agent's metrics listener")
        refused = httpx.get(f"{url}/metrics", timeout=5)
        assert refused.status_code == 401 and "vmsched_agent" not in refused.text
        wrong_role = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {schedule_only}"}, timeout=5)
        assert wrong_role.status_code == 401
        allowed = httpx.get(f"{url}/metrics", headers=AUTH, timeout=5)
        assert allowed.status_code == 200 and "vmsched_agent_guests_managed" in allowed.text
    finally:
        proc.terminate()
        proc.wait(15)
