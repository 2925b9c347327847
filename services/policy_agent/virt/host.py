"""The host as libvirt sees it: its identity and its CPU topology (the one place the agent reads them)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import libvirt

from ..policy.topology import Topology, from_counts, parse_capabilities


def host_uuid(conn: "libvirt.virConnect") -> str | None:
    """libvirt's host UUID from its capabilities (readable without root), or None."""
    try:
        return ET.fromstring(conn.getCapabilities()).findtext("host/uuid") or None
    except (libvirt.libvirtError, ET.ParseError):
        return None


def read_topology(conn: "libvirt.virConnect") -> Topology:
    """The host's CPUs, cores, sockets and NUMA nodes from its capabilities: the host's CPUs for the whole
    agent. A driver whose capabilities list no NUMA cell (the test driver with a node XML file) is described
    from its node info (``getInfo``: NUMA nodes x sockets x cores x threads)."""
    topology = parse_capabilities(conn.getCapabilities())
    if topology is None:
        _model, memory_mib, cpus, _mhz, nodes, sockets, cores, threads = conn.getInfo()[:8]
        topology = from_counts(cpus, nodes, sockets, cores, threads, memory_mib * 1024)
    return topology
