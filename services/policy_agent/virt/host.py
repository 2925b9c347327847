"""The host as libvirt sees it: its identity and its CPUs."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import libvirt

from ..policy import cpuset
from .apply import Caps


def host_uuid(conn: "libvirt.virConnect") -> str | None:
    """libvirt's host UUID from its capabilities (readable without root), or None."""
    try:
        return ET.fromstring(conn.getCapabilities()).findtext("host/uuid") or None
    except (libvirt.libvirtError, ET.ParseError):
        return None


def host_identity(conn: "libvirt.virConnect") -> str:
    """libvirt's host UUID, else its hostname."""
    return host_uuid(conn) or conn.getHostname()


def host_cpus(conn: "libvirt.virConnect", caps: Caps) -> tuple[frozenset[int], int]:
    """(online CPUs, length of a cpumap). The test driver's online map is fake: all count."""
    ncpus, online, _ = conn.getCPUMap()
    if not caps.vcpu_pin_flags:  # test driver
        return frozenset(range(ncpus)), ncpus
    return cpuset.from_cpumap(online), ncpus
