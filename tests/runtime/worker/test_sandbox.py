"""The plugin sandbox against hostile plugins, one escape per test, on real processes.

A stand-in service (tests/support/sandbox_host.py) runs a PluginPool in its own process,
with a credential in its environment and on its command line, as root (the
worker switches to ``nobody``), as root with --allow-root-plugins semantics (the
venv's Python is not readable by ``nobody`` on this machine), and as the
unprivileged user ``nobody`` itself (setpriv). Each test checks the state of
the OS: the file is not written, no process is left, no credential is seen.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT
from vmsched.runtime.worker import landlock

HOSTILE = ROOT / "tests" / "plugins_hostile"
HOST = ROOT / "tests" / "support" / "sandbox_host.py"
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
SITE = ROOT / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
SECRET_ENV, SECRET_ARG = "s3cr3t-env-pw", "s3cr3t-arg-pw"
IS_ROOT = os.geteuid() == 0
NEEDS_LANDLOCK = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI >= 6 (Linux >= 6.12)")


def _modes() -> list[Any]:
    """How the stand-in service runs: (name, command prefix, confinement)."""
    why_root = "these modes start the service as root (CI runs as root)"
    why_python = f"needs {SYSTEM_PYTHON} (a Python the user nobody can read) and the venv at {SITE}"
    other = not (SYSTEM_PYTHON.exists() and SITE.is_dir())
    return [
        pytest.param(("root-keeps-root", [sys.executable], {"allow_root": True}), id="root-allow-root",
                     marks=pytest.mark.skipif(not IS_ROOT, reason=why_root)),
        pytest.param(("root-switches", [str(SYSTEM_PYTHON)], {}), id="root-switches-to-nobody",
                     marks=pytest.mark.skipif(not IS_ROOT or other, reason=f"{why_root}; {why_python}")),
        pytest.param(("nobody", ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", str(SYSTEM_PYTHON)],
                     {}), id="unprivileged-nobody",
                     marks=pytest.mark.skipif(not IS_ROOT or other or not shutil.which("setpriv"), reason=f"{why_root}; {why_python}")),
    ]


@pytest.fixture
def folder() -> Iterator[Path]:
    """The hostile plugins in a folder every user may read and write (the worst case)."""
    path = Path(tempfile.mkdtemp(prefix="vmsched-hostile-"))
    path.chmod(0o777)
    for source in HOSTILE.glob("*.py"):
        shutil.copy(source, path / source.name)
        (path / source.name).chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def host(mode: tuple[str, list[str], dict[str, Any]], folder: Path, plugin: str, args: dict[str, Any] | None = None,
         **confinement: Any) -> dict[str, Any]:
    _name, prefix, base = mode
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "VMSCHED_AMQP_URL": f"amqp://vmsched:{SECRET_ENV}@127.0.0.1:5672/",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(SITE)])}
    command = [*prefix, str(HOST), str(folder), plugin, json.dumps(args or {}), json.dumps({**base, **confinement}),
               "--amqp", f"amqp://vmsched:{SECRET_ARG}@127.0.0.1:5672/"]
    done = subprocess.run(command, env=env, capture_output=True, timeout=120, cwd="/")
    lines = done.stdout.decode().strip().splitlines()
    assert done.returncode == 0 and lines, f"host failed ({done.returncode}): {done.stdout[-2000:]!r} {done.stderr[-4000:]!r}"
    reply = json.loads(lines[-1])
    reply["host_output"] = done.stdout + done.stderr
    return reply


MODES = _modes()


@pytest.mark.parametrize("mode", MODES)
def test_no_credential_in_the_plugins_view(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "environ_spy")
    assert reply["result"]["ok"], reply
    seen = json.dumps(reply["result"]["value"])
    assert SECRET_ENV not in seen and SECRET_ARG not in seen
    assert "VMSCHED_AMQP_URL" not in reply["result"]["value"]["environ"]
    assert reply["result"]["value"]["parent_environ"].startswith("refused")


@pytest.mark.parametrize("mode", MODES)
def test_plugin_cannot_install_a_plugin(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "installer")
    assert not reply["result"]["ok"]
    assert "PermissionError" in reply["result"]["error"]
    assert not (folder / "planted.py").exists()


@pytest.mark.parametrize("mode", MODES)
def test_plugin_cannot_signal_its_service(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "parricide")  # the host answering at all means it survived
    assert reply["result"]["ok"], reply
    assert reply["result"]["value"] == {"parent": "PermissionError", "all": "PermissionError", "parent_group": "PermissionError"}


@pytest.mark.parametrize("mode", MODES)
def test_ptrace_mount_modules_and_keys_are_refused(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "tracer")
    assert reply["result"]["ok"], reply
    assert set(reply["result"]["value"].values()) == {os.strerror(1)}, reply["result"]["value"]


@pytest.mark.parametrize("mode", MODES)
def test_broker_port_unreachable_and_the_error_names_the_setting(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "netcall")
    assert not reply["result"]["ok"]
    assert "PermissionError" in reply["result"]["error"] and "--plugin-network" in reply["result"]["error"]


def test_network_setting_lets_a_plugin_connect(folder: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        (folder / "netcall.py").write_text((HOSTILE / "netcall.py").read_text().replace("5672", str(port)))
        reply = host(MODES[0].values[0] if IS_ROOT else ("self", [sys.executable], {}), folder, "netcall", network=True)
    assert reply["result"]["ok"], reply
    assert "allowed (--plugin-network)" in reply["sandbox"]["no_network"]


@pytest.mark.skipif(not IS_ROOT, reason="reading /etc/shadow is only possible for root")
@pytest.mark.parametrize("mode", MODES[:2])
def test_root_service_plugin_cannot_read_shadow(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "shadow")
    assert not reply["result"]["ok"]
    assert "PermissionError" in reply["result"]["error"]
    shadow_first = Path("/etc/shadow").read_text().splitlines()[0]
    assert shadow_first.encode() not in reply["host_output"]


@pytest.mark.skipif(not IS_ROOT, reason="the switch happens only when the service runs as root")
def test_root_service_switches_user_and_drops_capabilities(folder: Path) -> None:
    mode = MODES[1].values[0]
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"needs {SYSTEM_PYTHON}")
    reply = host(mode, folder, "status", limits={"max_procs": 100, "max_files": 64, "max_file_mb": 2})
    value = reply["result"]["value"]
    assert value["uid"] == 65534
    assert value["status"]["CapEff"] == value["status"]["CapPrm"] == value["status"]["CapAmb"] == "0" * 16
    assert value["status"]["NoNewPrivs"] == "1" and value["status"]["Seccomp"] == "2"
    assert value["status"]["Groups"] == ""
    assert value["limits"] == {"RLIMIT_NPROC": 100, "RLIMIT_NOFILE": 64, "RLIMIT_FSIZE": 2 << 20}
    assert Path(value["cwd"]) == folder


@pytest.mark.skipif(not IS_ROOT, reason="the refusal concerns services running as root")
def test_root_service_refuses_when_it_cannot_switch(folder: Path) -> None:
    reply = host(("root", [sys.executable], {}), folder, "status", user="no-such-user-here")
    assert "--allow-root-plugins" in reply["start_error"] and "no-such-user-here" in reply["start_error"]


@pytest.mark.parametrize("mode", MODES[:1])
def test_file_size_limit(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "bigfile", {"mb": 2}, limits={"max_file_mb": 2})
    value = reply["result"]["value"]
    assert value["error"] == "OSError" and value["errno"] == 27 and value["size"] == 2 << 20  # EFBIG


@pytest.mark.slow
@pytest.mark.alone  # its 300 processes as nobody count against the limit of every other plugin worker
@pytest.mark.parametrize("mode", MODES)
def test_no_process_outlives_the_call(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "breeder", {"children": 300}, limits={"max_procs": 2000})
    value = reply["result"]["value"]
    assert len(value["children"]) >= 100, value
    left = [pid for pid in [*value["children"], value["daemon"]] if Path(f"/proc/{pid}").exists()]
    assert left == []


@pytest.mark.parametrize("mode", MODES[:1])
def test_raw_output_never_reaches_the_service_log(mode: Any, folder: Path) -> None:
    reply = host(mode, folder, "flood")
    assert reply["result"]["ok"], reply
    assert b"FLOOD-MARKER" not in reply["host_output"]
    assert len(reply["host_output"]) < 64 * 1024
