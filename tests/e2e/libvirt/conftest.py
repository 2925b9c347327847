"""Fixtures of the end-to-end tests on a real libvirtd with real QEMU guests.

Run (as root):   .venv/bin/python -m pytest tests/e2e/libvirt -q

The session fixture runs scripts/libvirt-setup.sh (installs the Debian
packages if missing, prepares and starts libvirtd) and, at the end,
scripts/libvirt-teardown.sh (removes leftover test guests and the test hook,
stops libvirtd only if setup started it, and reports exactly what it stopped
or left alone). Setup records whether it started libvirtd; tests that kill or
restart libvirtd take the ``own_libvirtd`` fixture and skip, saying why, when
a libvirtd was already running before the tests (it is not theirs to kill).
When the machine cannot run
libvirtd (not root, no apt, setup fails, libvirtd does not answer) every test
here is skipped and the reason is printed; set VMSCHED_E2E_REQUIRE=1 to make
that a failure instead (for the own_libvirtd skips too: CI, where no
libvirtd runs beforehand, must run every test). VMSCHED_E2E_KEEP_LIBVIRTD=1
skips the teardown script.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.e2e.libvirt import helpers as h
from tests.support import libvirtd

_SKIP_REASON: list[str] = []
_NOTES: list[str] = []


def _note(msg: str) -> None:
    _NOTES.append(msg)
    print(f"\n[e2e/libvirt] {msg}", file=sys.__stderr__, flush=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SKIP_REASON:
        terminalreporter.write_sep("=", "e2e/libvirt tests SKIPPED", yellow=True)
        for r in _SKIP_REASON:
            terminalreporter.write_line(r)
    elif _NOTES:
        terminalreporter.write_sep("-", "e2e/libvirt")
        for n in _NOTES:
            terminalreporter.write_line(n)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def _failed(request: pytest.FixtureRequest) -> bool:
    node = request.node
    return any(getattr(getattr(node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))


def _skip(reason: str) -> None:
    msg = f"e2e/libvirt: {reason}"
    if not _SKIP_REASON:
        _SKIP_REASON.append(msg)
        print(f"\n{msg}", file=sys.__stderr__, flush=True)
    if os.environ.get("VMSCHED_E2E_REQUIRE") == "1":
        pytest.fail(msg + " (VMSCHED_E2E_REQUIRE=1)", pytrace=False)
    pytest.skip(msg)


class Env:
    """The prepared machine: a libvirt connection with an event loop, and its event log."""

    def __init__(self) -> None:
        self.lv = h.Libvirt()
        self.events = h.EventLog()
        self.lv.on_connect(self.events.attach)
        self.host_cpus = h.host_cpus()

    @property
    def conn(self) -> Any:
        return self.lv.conn

    def ensure_libvirtd(self) -> None:
        """Make sure libvirtd runs (a test may have killed it) and the connection is usable."""
        if libvirtd.libvirtd_pid() is None:
            _note("libvirtd was not running before a test: restarting it with libvirt-setup.sh")
            libvirtd.run_setup()
        h.wait_until(lambda: self.conn.getURI(), timeout=30, what="a live qemu:///system connection")

    def remove_test_guests(self) -> list[str]:
        names = [n for n in self.conn.listDefinedDomains() if n.startswith(h.PREFIX)]
        names += [d.name() for d in self.conn.listAllDomains() if d.name().startswith(h.PREFIX)]
        h.remove_guests(self.conn, sorted(set(names)))
        return sorted(set(names))


@pytest.fixture(scope="session")
def e2e_env() -> Iterator[Env]:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("the real-QEMU tests share one libvirtd: run them in one process (-p no:xdist), as "
                    "scripts/test does beside the xdist workers", pytrace=False)
    if os.geteuid() != 0:
        _skip(f"needs root to install packages and run libvirtd (euid {os.geteuid()})")
    if not libvirtd.SETUP.exists():
        _skip(f"{libvirtd.SETUP} is missing")
    t0 = time.monotonic()
    proc = libvirtd.run_setup(check=False)
    if proc.returncode != 0:
        _skip(f"{libvirtd.SETUP.name} failed (exit {proc.returncode}); libvirtd cannot run here:\n"
              f"{(proc.stdout + proc.stderr).strip()}")
    if not Path(libvirtd.LIBVIRTD).exists():
        _skip(f"{libvirtd.LIBVIRTD} not present after {libvirtd.SETUP.name}")
    try:
        import libvirt  # noqa: F401
    except ImportError as exc:
        _skip(f"libvirt-python not importable in {sys.prefix}: {exc}")
    h.start_event_loop()
    env = Env()
    try:
        env.ensure_libvirtd()
    except Exception as exc:  # noqa: BLE001
        _skip(f"libvirtd does not answer on {h.URI}: {exc}")
    leftovers = env.remove_test_guests()
    ours, why = libvirtd.libvirtd_owner()
    _note(f"libvirtd ready in {time.monotonic() - t0:.1f} s (pid {libvirtd.libvirtd_pid()}, host CPUs "
          f"{sorted(env.host_cpus)})" + (f"; removed leftover guests {leftovers}" if leftovers else "")
          + f"; {why}" + ("" if ours else ": the tests that kill libvirtd will skip"))
    try:
        yield env
    finally:
        try:
            env.ensure_libvirtd()
            env.remove_test_guests()
        except Exception as exc:  # noqa: BLE001
            _note(f"cleanup of test guests failed: {exc!r}")
        env.lv.close()
        if os.environ.get("VMSCHED_E2E_KEEP_LIBVIRTD") == "1":
            _note("VMSCHED_E2E_KEEP_LIBVIRTD=1: libvirt-teardown.sh not run")
        else:
            td = libvirtd.run_teardown()
            _note("teardown: " + " | ".join(td.stdout.strip().splitlines())
                  + (f" | ERROR (exit {td.returncode}): {td.stderr.strip()}" if td.returncode else ""))


@pytest.fixture
def own_libvirtd(env: Env) -> Env:
    """For tests that kill or restart libvirtd: only when this session started it (else skip, saying why;
    with VMSCHED_E2E_REQUIRE=1 that is a failure)."""
    libvirtd.require_own_libvirtd()
    return env


@pytest.fixture
def env(e2e_env: Env) -> Env:
    """Per test: libvirtd is up and the connection is live."""
    e2e_env.ensure_libvirtd()
    return e2e_env


class Guests:
    """Defines disk-less TCG guests named vmsched-e2e-<n>; removes them all at teardown."""

    counter = 0

    def __init__(self, env: Env):
        self.env = env
        self.names: list[str] = []

    def define(self, vcpus: int = 2, memory_mib: int = 64) -> str:
        Guests.counter += 1
        name = f"{h.PREFIX}{Guests.counter}"
        h.remove_guest(self.env.conn, name)
        self.env.conn.defineXML(h.guest_xml(name, vcpus=vcpus, memory_mib=memory_mib))
        self.names.append(name)
        return name

    def dom(self, name: str) -> Any:
        return self.env.conn.lookupByName(name)

    def start(self, name: str) -> h.OSGuest:
        """Start via the libvirt API and wait for the QEMU process with all its vCPU threads."""
        dom = self.dom(name)
        dom.create()
        g = h.OSGuest(name)
        n = dom.maxVcpus() if dom.isActive() else None
        h.wait_until(lambda: g.running() and (n is None or len(g.vcpus()) == n), timeout=30,
                     what=f"QEMU process and vCPU threads of {name}")
        return g

    def destroy(self, name: str) -> None:
        dom = self.dom(name)
        if dom.isActive():
            dom.destroy()
        h.wait_until(lambda: not h.OSGuest(name).running(), timeout=30, what=f"{name}'s QEMU process to exit")

    def cleanup(self) -> None:
        self.env.ensure_libvirtd()
        h.remove_guests(self.env.conn, self.names)


@pytest.fixture
def guests(env: Env) -> Iterator[Guests]:
    g = Guests(env)
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture
def agent_factory(env: Env, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``agent_factory(dedicated_pool="none", start=True, reconcile_interval=None, ...)``: the real
    agent as a separate process (its own state dir and socket under tmp_path); stopped at teardown,
    its log printed when the test failed."""
    started: list[h.AgentProcess] = []

    def make(dedicated_pool: str | None = "none", start: bool = True, **kw: Any) -> h.AgentProcess:
        a = h.AgentProcess(tmp_path / f"agent{len(started) + 1}", dedicated_pool=dedicated_pool, **kw)
        started.append(a)
        return a.start() if start else a

    try:
        yield make
    finally:
        for a in started:
            a.stop()
            if _failed(request):
                print(f"\n----- agent log ({a.log_path}) -----\n{a.log_tail(150)}")


@pytest.fixture
def agent(agent_factory: Any) -> h.AgentProcess:
    """The real agent, no dedicated pool."""
    return agent_factory()
