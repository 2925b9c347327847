"""The real libvirtd of the end-to-end tests: set up, torn down, stopped and restarted.

scripts/libvirt-setup.sh starts libvirtd (and records that it did) and
scripts/libvirt-teardown.sh stops it only then; these helpers never signal a
libvirtd the tests did not start.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.waiting import Timeout, wait_until

SETUP = ROOT / "scripts" / "libvirt-setup.sh"
TEARDOWN = ROOT / "scripts" / "libvirt-teardown.sh"
LIBVIRTD = "/usr/sbin/libvirtd"
LIBVIRTD_PIDFILE = Path("/run/libvirtd.pid")
STATE_DIR = Path(os.environ.get("VMSCHED_TEST_STATE_DIR", "/run/vmsched-test"))


# --- libvirtd --------------------------------------------------------------------
def libvirtd_pid() -> int | None:
    """PID of the running libvirtd (pid file, else a /proc scan), ignoring zombies."""
    def alive(pid: int) -> bool:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        return comm == "libvirtd" and not re.search(r"^State:\s+Z", status, re.M)

    try:
        pid = int(LIBVIRTD_PIDFILE.read_text().strip())
        if alive(pid):
            return pid
    except (OSError, ValueError):
        pass
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and alive(int(d.name)):
            return int(d.name)
    return None


LIBVIRTD_STATE = STATE_DIR / "libvirtd.started"


class NotOurLibvirtd(RuntimeError):
    """Refusal to stop or kill a libvirtd the test session did not start."""


def libvirtd_owner() -> tuple[bool, str]:
    """(True, why) when the running libvirtd is the one scripts/libvirt-setup.sh started in this session
    (its state file says "yes PID" for the running pid); (False, why not) otherwise."""
    pid = libvirtd_pid()
    try:
        owner, _, recorded = LIBVIRTD_STATE.read_text().strip().partition(" ")
    except OSError:
        owner, recorded = "", ""
    if pid is None:
        return False, "libvirtd is not running"
    if owner == "yes" and recorded == str(pid):
        return True, f"libvirtd pid {pid} was started by {SETUP.name} for these tests"
    if owner == "no":
        return False, (f"libvirtd pid {recorded} was already running before the tests; killing it would disturb"
                       " this host")
    return False, (f"libvirtd pid {pid} was not started by {SETUP.name} ({LIBVIRTD_STATE} says"
                   f" {owner + ' ' + recorded if owner else 'nothing'}); killing it would disturb this host")


def require_own_libvirtd() -> None:
    """Skip the calling test (fail with VMSCHED_E2E_REQUIRE=1) unless this session started libvirtd."""
    import pytest

    ours, why = libvirtd_owner()
    if not ours:
        msg = f"e2e/libvirt: {why}"
        if os.environ.get("VMSCHED_E2E_REQUIRE") == "1":
            pytest.fail(msg + " (VMSCHED_E2E_REQUIRE=1: the suite must start its own libvirtd)", pytrace=False)
        pytest.skip(msg)


def run_setup(check: bool = True) -> subprocess.CompletedProcess:
    """scripts/libvirt-setup.sh with this interpreter's venv; output captured."""
    proc = subprocess.run(["sh", str(SETUP), sys.prefix], capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{SETUP} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def run_teardown() -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(TEARDOWN)], capture_output=True, text=True, timeout=120)


def stop_libvirtd(sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
    """Send ``sig`` to libvirtd and wait until the process is gone; returns its old pid.
    Refuses (NotOurLibvirtd) when this test session did not start it."""
    ours, why = libvirtd_owner()
    if not ours:
        raise NotOurLibvirtd(f"refusing to send signal {sig} to libvirtd: {why}")
    pid = libvirtd_pid()
    if pid is None:
        raise RuntimeError("libvirtd is not running")
    os.kill(pid, sig)

    def gone() -> bool:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return True
        return bool(re.search(r"^State:\s+Z", status, re.M))

    try:
        wait_until(gone, timeout=timeout, interval=0.05, what=f"libvirtd (pid {pid}) to exit after signal {sig}")
    except Timeout:
        os.kill(pid, signal.SIGKILL)
        wait_until(gone, timeout=10, interval=0.05, what=f"libvirtd (pid {pid}) to exit after SIGKILL")
    return pid


def restart_libvirtd(sig: int = signal.SIGTERM) -> tuple[int, int]:
    """Stop libvirtd with ``sig`` and start it again with the setup script: (old pid, new pid)."""
    old = stop_libvirtd(sig)
    run_setup()
    new = libvirtd_pid()
    if new is None:
        raise RuntimeError("libvirtd is not running after libvirt-setup.sh")
    return old, new
