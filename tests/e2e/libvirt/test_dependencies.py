"""Start dependencies, enforced by libvirt itself through the shipped QEMU hook.

The module installs services/policy_agent/surfaces/hooks/qemu as /etc/libvirt/hooks/qemu
(backing up and later restoring whatever was there), restarts libvirtd so it
sees the hook, and at the end removes it and restarts libvirtd again.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.libvirt import helpers as h
from tests.support import libvirtd

pytestmark = pytest.mark.libvirt


class Hook:
    def __init__(self, log_dir: Path):
        self.log_dir = log_dir

    def configure(self, socket_path: Path, on_unreachable: str = "allow", timeout: float = 5.0,
                  log_file: Path | None = None) -> Path:
        """Write the hook's config file (read at every hook run: no libvirtd restart needed)."""
        log_file = log_file or self.log_dir / f"hook-{time.monotonic_ns()}.log"
        h.HOOK_CONF.parent.mkdir(parents=True, exist_ok=True)
        h.HOOK_CONF.write_text(f"# written by tests/e2e/libvirt/test_dependencies.py\n"
                               f"socket = {socket_path}\ntimeout = {timeout}\n"
                               f"on_unreachable = {on_unreachable}\nlog_file = {log_file}\n")
        return log_file


@pytest.fixture(scope="module")
def hook(e2e_env, tmp_path_factory):
    libvirtd.require_own_libvirtd()  # installing the hook restarts libvirtd: only one this session started
    backup = tmp_path_factory.mktemp("hook-backup")
    saved: dict[Path, Path] = {}
    created: list[Path] = []
    for d in (h.HOOK_PATH.parent, h.HOOK_CONF.parent):
        if not d.exists():
            created.append(d)
    for path in (h.HOOK_PATH, h.HOOK_CONF):
        if path.exists():
            saved[path] = backup / path.name
            shutil.copy2(path, saved[path])
    h.HOOK_PATH.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(h.HOOK_SRC, h.HOOK_PATH)
    os.chmod(h.HOOK_PATH, 0o755)
    libvirtd.STATE_DIR.mkdir(parents=True, exist_ok=True)
    (libvirtd.STATE_DIR / "hook.installed").write_text(str(h.HOOK_PATH) + "\n")
    ctl = Hook(tmp_path_factory.mktemp("hook-logs"))
    ctl.configure(Path("/nonexistent/agent.sock"))
    try:
        e2e_env.ensure_libvirtd()
        libvirtd.restart_libvirtd(signal.SIGTERM)  # libvirtd looks for hook scripts only when it starts
        e2e_env.ensure_libvirtd()
        yield ctl
    finally:
        for path in (h.HOOK_PATH, h.HOOK_CONF):
            if path in saved:
                shutil.copy2(saved[path], path)
            else:
                path.unlink(missing_ok=True)
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
        (libvirtd.STATE_DIR / "hook.installed").unlink(missing_ok=True)
        if libvirtd.libvirtd_pid() is not None:
            libvirtd.restart_libvirtd(signal.SIGTERM)  # forget the hook
        else:
            libvirtd.run_setup()
        e2e_env.ensure_libvirtd()


def _events(env, since: float, event: int, count: int, timeout: float = 10.0) -> list[str]:
    """The guests of the ``event`` events since ``since``, once ``count`` have come (libvirt's event thread delivers
    them after the call that caused them returned), or those that came within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        names = [name for _, name, ev, _ in env.events.since(since) if ev == event]
        if len(names) >= count or time.monotonic() > deadline:
            return names
        time.sleep(0.05)


def test_dependent_guest_refused_until_its_requirement_runs(env, guests, agent_factory, hook):
    import libvirt

    agent = agent_factory()
    log_file = hook.configure(agent.socket_path)
    req = guests.define(vcpus=1)
    dep = guests.define(vcpus=1)
    agent.cli("policy", "set", dep, "--requires", req)

    # 1. a plain `virsh start` of the dependent guest is refused by libvirt, with the agent's message
    proc = h.virsh("start", dep)
    assert proc.returncode != 0, f"virsh start {dep} succeeded while {req} was off: {proc.stdout}"
    assert "requires" in proc.stderr and repr(req) in proc.stderr, proc.stderr
    assert "vmsched domain start" in proc.stderr, proc.stderr
    assert not h.OSGuest(dep).running(), "no QEMU process may exist for the refused guest"
    assert not guests.dom(dep).isActive()
    assert not h.OSGuest(req).running()
    # the CLI's check-start says the same thing
    cs = agent.cli("policy", "check-start", dep, check=False)
    assert cs.returncode == 1 and req in cs.stderr, (cs.returncode, cs.stderr)

    # 2. `vmsched domain start DEP` starts the requirement first, then the dependent
    t0 = time.monotonic()
    out = agent.cli_json("domain", "start", dep)
    assert out["started"] == [req, dep], out
    r, d = h.OSGuest(req), h.OSGuest(dep)
    assert r.running() and d.running()
    assert r.start_ticks() <= d.start_ticks(), "the requirement's QEMU process must be the older one"
    assert _events(env, t0, libvirt.VIR_DOMAIN_EVENT_STARTED, 2) == [req, dep]

    # 3. with the requirement running, libvirt lets the dependent start directly
    guests.destroy(dep)
    proc = h.virsh("start", dep)
    assert proc.returncode == 0, proc.stderr
    assert h.OSGuest(dep).running()

    # 4. `vmsched domain stop REQ` stops the dependent first (SeaBIOS ignores ACPI: --force)
    t1 = time.monotonic()
    out = agent.cli_json("domain", "stop", req, "--wait", "1", "--force")
    assert out["stopped"] == [dep, req], out
    assert not r.running() and not d.running()
    assert _events(env, t1, libvirt.VIR_DOMAIN_EVENT_STOPPED, 2) == [dep, req]

    # 5. and the dependent is refused again
    proc = h.virsh("start", dep)
    assert proc.returncode != 0 and repr(req) in proc.stderr, (proc.returncode, proc.stderr)
    assert not h.OSGuest(dep).running()

    # every decision came from the agent: the hook never had to fall back
    text = log_file.read_text()
    assert "could not be asked" not in text, text
    assert text.count("refusing to start") == 2, text


def test_hook_when_the_agent_is_unreachable(env, guests, agent_factory, hook):
    agent = agent_factory()
    req = guests.define(vcpus=1)
    dep = guests.define(vcpus=1)
    agent.cli("policy", "set", dep, "--requires", req)
    agent.stop()

    # default: fail-open, with a log line
    log_file = hook.configure(agent.socket_path, on_unreachable="allow", timeout=1)
    proc = h.virsh("start", dep)
    assert proc.returncode == 0, proc.stderr
    assert h.OSGuest(dep).running()
    text = log_file.read_text()
    assert f"allowing {dep} to start unchecked" in text and "could not be asked" in text, text
    guests.destroy(dep)

    # fail-closed
    log_file = hook.configure(agent.socket_path, on_unreachable="deny", timeout=1)
    proc = h.virsh("start", dep)
    assert proc.returncode != 0, proc.stdout
    assert "could not be asked" in proc.stderr and "on_unreachable=deny" in proc.stderr, proc.stderr
    assert not h.OSGuest(dep).running()

    # agent back: its answer wins again
    agent.start()
    hook.configure(agent.socket_path, on_unreachable="deny")
    proc = h.virsh("start", dep)
    assert proc.returncode != 0 and "requires" in proc.stderr, proc.stderr
    out = agent.cli_json("domain", "start", dep)
    assert out["started"] == [req, dep], out
