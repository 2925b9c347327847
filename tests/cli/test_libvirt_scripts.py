"""The libvirtd ownership decisions of scripts/libvirt-setup.sh and libvirt-teardown.sh
(scripts/libvirtd-state.sh), run against a stand-in daemon — a `sleep` this test starts — and a
state folder in tmp_path: the real libvirtd is never looked at, stopped or killed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support import libvirtd

LIB = Path(__file__).resolve().parents[2] / "scripts" / "libvirtd-state.sh"

COMM = f"vmsf{uuid.uuid4().hex[:8]}"  # the stand-in's process name: no other process has it


@pytest.fixture
def daemon(tmp_path):
    """A stand-in libvirtd: a copy of sleep under a unique name, its pid in a pid file."""
    exe = tmp_path / COMM
    shutil.copy(shutil.which("sleep"), exe)
    proc = subprocess.Popen([str(exe), "300"])
    (tmp_path / "fake.pid").write_text(f"{proc.pid}\n")
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def run(tmp_path: Path, script: str) -> str:
    env = {**os.environ, "VMSCHED_TEST_STATE_DIR": str(tmp_path / "state"),
           "LIBVIRTD_PIDFILE": str(tmp_path / "fake.pid"), "LIBVIRTD_COMM": COMM}
    proc = subprocess.run(["sh", "-c", f". {LIB}; {script}"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_daemon_running_before_setup_is_recorded_and_left_alone(tmp_path, daemon):
    assert run(tmp_path, "running_pid") == str(daemon.pid)
    run(tmp_path, 'record_found "$(running_pid)"')
    assert (tmp_path / "state" / "libvirtd.started").read_text() == f"no {daemon.pid}\n"
    # a later setup run (a test restarted "libvirtd") does not change who owns it
    run(tmp_path, "record_started 4242")
    assert (tmp_path / "state" / "libvirtd.started").read_text() == f"no {daemon.pid}\n"
    report = run(tmp_path, "teardown_libvirtd")
    assert report == f"left libvirtd (pid {daemon.pid}) running: libvirtd (pid {daemon.pid}) was already running before setup"
    assert daemon.poll() is None, "teardown killed a daemon setup did not start"
    assert "stopped" not in report


def test_a_daemon_setup_started_is_stopped_and_the_report_says_so(tmp_path, daemon):
    run(tmp_path, 'record_started "$(running_pid)"')
    assert (tmp_path / "state" / "libvirtd.started").read_text() == f"yes {daemon.pid}\n"
    report = run(tmp_path, "teardown_libvirtd")
    assert report == f"stopped libvirtd (pid {daemon.pid}), which setup started"
    assert daemon.wait(10) is not None
    assert not (tmp_path / "state" / "libvirtd.started").exists()


def test_another_daemon_than_the_one_setup_started_is_left_alone(tmp_path, daemon):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "libvirtd.started").write_text("yes 999999\n")
    report = run(tmp_path, "teardown_libvirtd")
    assert report == f"left libvirtd (pid {daemon.pid}) running: setup started pid 999999, not this one"
    assert daemon.poll() is None


def test_nothing_running_nothing_claimed(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "libvirtd.started").write_text("yes 999999\n")
    assert run(tmp_path, "teardown_libvirtd") == ("nothing to stop: libvirtd started by setup (pid 999999)"
                                                   " is no longer running")
    assert run(tmp_path, "teardown_libvirtd") == "nothing to stop: libvirtd is not running"


def test_the_test_helpers_refuse_to_signal_a_libvirtd_they_did_not_start(tmp_path, daemon, monkeypatch):
    state = tmp_path / "libvirtd.started"
    monkeypatch.setattr(libvirtd, "LIBVIRTD_STATE", state)
    monkeypatch.setattr(libvirtd, "libvirtd_pid", lambda: daemon.pid)
    state.write_text(f"no {daemon.pid}\n")
    ours, why = libvirtd.libvirtd_owner()
    assert not ours
    assert why == (f"libvirtd pid {daemon.pid} was already running before the tests; killing it would disturb"
                   " this host")
    with pytest.raises(libvirtd.NotOurLibvirtd, match="already running before the tests"):
        libvirtd.stop_libvirtd(signal.SIGKILL)
    assert daemon.poll() is None, "the helper signalled a daemon the tests did not start"
    state.unlink()
    with pytest.raises(libvirtd.NotOurLibvirtd, match="was not started by"):
        libvirtd.stop_libvirtd(signal.SIGKILL)
    assert daemon.poll() is None
    state.write_text(f"yes {daemon.pid}\n")
    assert libvirtd.libvirtd_owner()[0]


def test_own_libvirtd_skip_fails_when_required(tmp_path, monkeypatch):
    monkeypatch.setattr(libvirtd, "LIBVIRTD_STATE", tmp_path / "libvirtd.started")
    monkeypatch.setattr(libvirtd, "libvirtd_pid", lambda: 4242)
    (tmp_path / "libvirtd.started").write_text("no 4242\n")
    monkeypatch.delenv("VMSCHED_E2E_REQUIRE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="libvirtd pid 4242 was already running before the tests"):
        libvirtd.require_own_libvirtd()
    monkeypatch.setenv("VMSCHED_E2E_REQUIRE", "1")
    with pytest.raises(pytest.fail.Exception, match="VMSCHED_E2E_REQUIRE=1"):
        libvirtd.require_own_libvirtd()
