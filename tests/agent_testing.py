"""Helpers for tests and benchmarks on libvirt's test driver (no libvirtd needed)."""

from __future__ import annotations

import time
from typing import Callable

import libvirt

from vmsched.services.policy_agent.policy import cpuset

TEST_URI = "test:///default"


def domain_xml(name: str, vcpus: int = 2, memory_kib: int = 65536, dtype: str = "test") -> str:
    return (f"<domain type='{dtype}'><name>{name}</name><memory unit='KiB'>{memory_kib}</memory>"
            f"<vcpu placement='static'>{vcpus}</vcpu><os><type>hvm</type></os></domain>")


def live_pins(dom: "libvirt.virDomain") -> dict[int, str]:
    return {i: cpuset.fmt(cpuset.from_cpumap(m)) for i, m in enumerate(dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE))}


def config_pins(dom: "libvirt.virDomain") -> dict[int, str]:
    return {i: cpuset.fmt(cpuset.from_cpumap(m)) for i, m in enumerate(dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_CONFIG))}


def emulator_pin(dom: "libvirt.virDomain", flags: int = libvirt.VIR_DOMAIN_AFFECT_LIVE) -> str:
    return cpuset.fmt(cpuset.from_cpumap(dom.emulatorPinInfo(flags)))


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.005) -> object:
    """Poll ``predicate`` until truthy; raise AssertionError with its last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last value {value!r})")
        time.sleep(interval)
        value = predicate()
    return value
