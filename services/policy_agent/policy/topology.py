"""The host's CPU topology, read from libvirt's capabilities XML: pure parsing, no libvirt.

libvirt lists every CPU under its NUMA cell (``host/topology/cells/cell/cpus/cpu``) with its
``socket_id``, ``core_id`` and ``siblings`` (the threads of its core); a CPU that is offline is
listed by its ``id`` alone.

A driver whose capabilities list no cell (libvirt's test driver with a node XML file) is described
by :func:`from_counts` from its node info instead (CPUs numbered node by node, socket by socket,
core by core, thread by thread).

The online CPUs found here are the host's CPUs for the whole agent: pools, allocations, pins and
the facts all count them from this one source.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from ..plural import plural


class TopologyError(ValueError):
    """The capabilities XML cannot be read."""


@dataclass(frozen=True)
class Cpu:
    id: int
    node: int
    socket: int = 0
    core: int = 0
    siblings: CpuSet = frozenset()  # the online threads of its core, itself included
    online: bool = True


@dataclass(frozen=True)
class Cell:
    id: int
    cpus: CpuSet  # every CPU of the cell, offline ones included
    memory_kib: int = 0


@dataclass(frozen=True)
class Topology:
    cpus: dict[int, Cpu]
    cells: tuple[Cell, ...]

    # --- views -------------------------------------------------------------------------------
    @property
    def online(self) -> CpuSet:
        return frozenset(c.id for c in self.cpus.values() if c.online)

    @property
    def offline(self) -> CpuSet:
        return frozenset(c.id for c in self.cpus.values() if not c.online)

    @property
    def cpumap_length(self) -> int:
        """How many CPUs a libvirt cpumap of this host holds (offline ones included)."""
        return max(self.cpus, default=-1) + 1

    def node_of(self, cpu: int) -> int:
        return self.cpus[cpu].node

    def nodes(self) -> list[int]:
        return [c.id for c in self.cells]

    def node_cpus(self, node: int) -> CpuSet:
        """The online CPUs of a NUMA node."""
        return frozenset(c.id for c in self.cpus.values() if c.online and c.node == node)

    def core_of(self, cpu: int) -> CpuSet:
        """The online threads of ``cpu``'s core (``cpu`` itself for an offline one)."""
        c = self.cpus.get(cpu)
        return c.siblings if c is not None and c.siblings else frozenset({cpu})

    def cores(self) -> list[CpuSet]:
        """Every core (its online threads), ordered by its lowest CPU."""
        return list(dict.fromkeys(self.core_of(cpu) for cpu in sorted(self.online)))

    def socket_cpus(self) -> dict[int, CpuSet]:
        """socket ID -> its online CPUs."""
        online = [c for c in self.cpus.values() if c.online]
        return {s: frozenset(c.id for c in online if c.socket == s) for s in sorted({c.socket for c in online})}

    def threads_per_core(self) -> int:
        return max((len(core) for core in self.cores()), default=1)

    def describe(self) -> str:
        """One line: '2 sockets, 48 cores, 96 threads, 2 NUMA nodes (4 offline CPUs: 96-99)'."""
        text = (f"{plural(len(self.socket_cpus()), 'socket')}, {plural(len(self.cores()), 'core')},"
                f" {plural(len(self.online), 'thread')}, {plural(len(self.cells), 'NUMA node')}")
        offline = f" ({plural(len(self.offline), 'offline CPU')}: {cpuset.fmt(self.offline)})" if self.offline else ""
        return text + offline


def flat(cpus: CpuSet) -> Topology:
    """One NUMA node, one socket, every CPU a core of its own: the topology of a host known by its CPUs only."""
    return Topology({i: Cpu(i, 0, 0, i, frozenset({i})) for i in cpus}, (Cell(0, frozenset(cpus)),))


def parse_capabilities(text: str) -> Topology | None:
    """The topology in a capabilities XML document; None when it lists no NUMA cell."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise TopologyError(f"capabilities XML unreadable: {exc}") from None
    host = root.find("host")
    if host is None:
        raise TopologyError("capabilities XML has no <host>")
    cpus: dict[int, Cpu] = {}
    cells: list[Cell] = []
    for cell in host.iterfind("topology/cells/cell"):
        node = _int(cell.get("id"), "cell id")
        for elem in cell.iterfind("cpus/cpu"):
            cpu = _cpu(elem, node)
            if cpu.id in cpus:
                raise TopologyError(f"CPU {cpu.id} is listed twice")
            cpus[cpu.id] = cpu
        memory = cell.find("memory")
        kib = _kib(memory) if memory is not None else 0
        cells.append(Cell(node, frozenset(c.id for c in cpus.values() if c.node == node), kib))
    return Topology(cpus, tuple(sorted(cells, key=lambda c: c.id))) if cpus else None


def from_counts(cpus: int, nodes: int, sockets: int, cores: int, threads: int, memory_kib: int = 0) -> Topology:
    """A topology from libvirt's node info (``nodes`` NUMA nodes of ``sockets`` x ``cores`` x ``threads``), for a
    driver whose capabilities list no cell; CPUs beyond ``cpus`` are left out."""
    nodes, sockets, cores, threads = (max(1, n) for n in (nodes, sockets, cores, threads))
    out: dict[int, Cpu] = {}
    cells = []
    cpu = 0
    for node in range(nodes):
        for socket in range(sockets):
            for core in range(cores):
                group = frozenset(range(cpu, min(cpu + threads, cpus)))
                for t in sorted(group):
                    out[t] = Cpu(t, node, node * sockets + socket, core, group)
                cpu += threads
        cells.append(Cell(node, frozenset(c.id for c in out.values() if c.node == node), memory_kib // nodes))
    return Topology(out, tuple(cells))


def _cpu(elem: ET.Element, node: int) -> Cpu:
    cpu_id = _int(elem.get("id"), "cpu id")
    siblings = elem.get("siblings")
    if elem.get("socket_id") is None or siblings is None:  # libvirt lists an offline CPU by its id alone
        return Cpu(cpu_id, node, online=False)
    try:
        threads = cpuset.parse(siblings) | {cpu_id}
    except cpuset.CpuSetError as exc:
        raise TopologyError(f"CPU {cpu_id}: siblings {siblings!r}: {exc}") from None
    return Cpu(cpu_id, node, _int(elem.get("socket_id"), "socket_id"), _int(elem.get("core_id", "0"), "core_id"),
               frozenset(threads))


_UNITS = {"b": 1 / 1024, "bytes": 1 / 1024, "kib": 1, "k": 1, "kb": 1, "mib": 1024, "m": 1024, "mb": 1024,
          "gib": 1024 ** 2, "g": 1024 ** 2, "gb": 1024 ** 2}


def _kib(elem: ET.Element) -> int:
    unit = (elem.get("unit") or "KiB").lower()
    return int(_int(elem.text, elem.tag) * _UNITS.get(unit, 1))


def _int(value: str | None, what: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise TopologyError(f"capabilities XML: {what} {value!r} is not a number") from None
