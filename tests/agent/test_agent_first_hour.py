"""What a first-timer meets running the agent on libvirt's test driver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.agent_driver import conn, domain_xml, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.paths import ROOT
from tests.support.waiting import wait_until
from vmsched.agent_contract import AgentOp
from vmsched.services.policy_agent.errors import AgentUnavailable
from vmsched.services.policy_agent.surfaces.client import SocketClient


def start_agent(tmp_path: Path, name: str, lock_dir: Path) -> tuple[subprocess.Popen, Path, Path]:
    sock, log = tmp_path / f"{name}.sock", tmp_path / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "vmsched.cli", "agent", "--libvirt", "test:///default",
         "--state-dir", str(tmp_path / name), "--socket", str(sock), "--lock-dir", str(lock_dir)],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, sock, log


def test_agents_on_per_process_test_drivers_do_not_refuse_each_other(tmp_path: Path):
    """Each process has its own test driver: no shared libvirtd for the host lock to guard."""
    lock_dir = tmp_path / "lock"  # the same folder, as every agent on a host would use
    agents = [start_agent(tmp_path, name, lock_dir) for name in ("one", "two")]
    try:
        for proc, sock, log in agents:
            def up() -> bool:
                assert proc.poll() is None, log.read_text()
                try:
                    return SocketClient(sock, timeout=2).call(AgentOp.PING)["connected"]
                except AgentUnavailable:
                    return False

            wait_until(up, timeout=60, what=f"the agent on {sock.name}")
    finally:
        for proc, _, _ in agents:
            proc.terminate()
        for proc, _, _ in agents:
            proc.wait(15)
    assert list(lock_dir.iterdir()) == [], "a process's own lock is removed when it stops"


def test_weight_and_cap_the_driver_cannot_apply_are_not_reported_applied(conn, make_agent):
    """libvirt's test driver has no scheduler parameters: the status says what was left out."""
    a = make_agent()
    conn.defineXML(domain_xml("t-w")).create()
    pins = a.set_policy("t-w", {"vcpu_pins": {"0": "1"}})
    assert (pins["status"], pins["warnings"]) == ("applied", [])
    view = a.set_policy("t-w", {"vcpu_pins": {"0": "1"}, "weight": 512, "cap_percent": 50})
    assert view["status"] == "partial"
    assert view["warnings"] == ["weight and cap not applied: libvirt's TEST driver has no scheduler parameters"]
    assert a.get_policy("t-w")["status"] == "partial"
    assert [p["status"] for p in a.list_policies()["policies"]] == ["partial"]
