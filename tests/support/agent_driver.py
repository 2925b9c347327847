"""Helpers for tests and benchmarks on libvirt's test driver (no libvirtd needed).

The fixtures ``conn``, ``state_dir`` and ``make_agent`` are used by importing them into a test module."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable

import libvirt
import pytest

from vmsched.metrics import REGISTRY
from vmsched.services.policy_agent.agent import Agent
from vmsched import cpuset
from vmsched.services.policy_agent.virt.connection import ensure_event_loop

TEST_URI = "test:///default"


def domain_xml(name: str, vcpus: int = 2, memory_kib: int = 65536, dtype: str = "test") -> str:
    return (f"<domain type='{dtype}'><name>{name}</name><memory unit='KiB'>{memory_kib}</memory>"
            f"<vcpu placement='static'>{vcpus}</vcpu><os><type>hvm</type></os></domain>")


def guest(conn: "libvirt.virConnect", name: str, vcpus: int = 2, start: bool = True) -> "libvirt.virDomain":
    """A test-driver guest ``name``, defined and (by default) started."""
    dom = conn.defineXML(domain_xml(name, vcpus))
    if start:
        dom.create()
    return dom


def cpus_of(cpumap: Iterable[bool]) -> str:
    """The CPU set of a cpumap as libvirt's binding returns it (a tuple of booleans), in libvirt's syntax."""
    return cpuset.fmt(i for i, on in enumerate(cpumap) if on)


def live_pins(dom: "libvirt.virDomain") -> dict[int, str]:
    return {i: cpus_of(m) for i, m in enumerate(dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE))}


def config_pins(dom: "libvirt.virDomain") -> dict[int, str]:
    return {i: cpus_of(m) for i, m in enumerate(dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_CONFIG))}


def emulator_pin(dom: "libvirt.virDomain", flags: int = libvirt.VIR_DOMAIN_AFFECT_LIVE) -> str:
    return cpus_of(dom.emulatorPinInfo(flags))


def metric(name: str, **labels: str) -> float:
    """A sample of the process's registry (the agent's metrics), 0 when the series does not exist."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def conn() -> Iterator["libvirt.virConnect"]:
    """A connection to the test driver; the guests named ``t-*`` are removed after the test."""
    ensure_event_loop()
    c = libvirt.open(TEST_URI)
    yield c
    for dom in c.listAllDomains(0):
        if dom.name().startswith("t-"):
            if dom.isActive():
                dom.destroy()
            if dom.isPersistent():
                dom.undefine()
    c.close()  # last connection closed: test:///default resets


@pytest.fixture
def state_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="vat"))  # short: UNIX socket paths are limited to 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_agent(state_dir: Path) -> Iterator[Callable[..., Agent]]:
    """Starts agents on the test driver (host h1, dedicated pool 4-7, no bus and no periodic sweep unless
    asked: ``transport=``, ``reconcile_interval=``); every one is stopped after the test."""
    agents: list[Agent] = []

    def make(**kw: Any) -> Agent:
        kw.setdefault("dedicated_pool", "4-7")
        kw.setdefault("reconcile_interval", 3600)
        kw.setdefault("lock_dir", state_dir / "lock")  # test:///default has one host identity: one lock per test
        a = Agent(TEST_URI, kw.pop("host_id", "h1"), state_dir, kw.pop("transport", None), **kw).start()
        agents.append(a)
        return a

    yield make
    for a in agents:
        a.stop()
