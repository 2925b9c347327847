"""Pure aggregation of host facts: CPU use from /proc/stat counters, the
oVirt-style free memory, the length of the short history and what changed.

No libvirt and no I/O: the collector (virt/collector.py) reads, this computes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from vmsched import cpuset
from vmsched.facts.model import DedicatedGuest, DedicatedNode, GuestFacts

from ..policy.model import GuestPolicy
from ..policy.topology import Topology, flat

KIB_PER_MIB = 1024
#: History length, seconds (the last 10 minutes).
HISTORY_SECONDS = 600.0


@dataclass(frozen=True)
class CpuTimes:
    """One CPU's /proc/stat counters (jiffies)."""

    busy: int  # user + nice + system + irq + softirq + steal
    idle: int  # idle + iowait

    @property
    def total(self) -> int:
        return self.busy + self.idle


def parse_stat(text: str) -> tuple[CpuTimes | None, dict[int, CpuTimes]]:
    """(all CPUs, per CPU) from /proc/stat."""
    total: CpuTimes | None = None
    per: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *values = line.split()
        user, nice, system, idle, iowait, irq, softirq, steal = ([int(v) for v in values[:8]] + [0] * 8)[:8]
        times = CpuTimes(user + nice + system + irq + softirq + steal, idle + iowait)
        if name == "cpu":
            total = times
        elif name[3:].isdigit():
            per[int(name[3:])] = times
    return total, per


def busy_pct(before: CpuTimes | None, after: CpuTimes) -> float:
    """% busy between two readings (since boot without the first)."""
    before = before or CpuTimes(0, 0)
    total = after.total - before.total
    if total <= 0:
        return 0.0
    return round(min(100.0, max(0.0, 100.0 * (after.busy - before.busy) / total)), 2)


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as KiB values by key."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0])
    return out


def memory_mib(info: dict[str, int]) -> dict[str, int]:
    """Total, oVirt's free (MemFree + Cached + Buffers + SReclaimable), available and swap, MiB."""
    free = sum(info.get(k, 0) for k in ("MemFree", "Cached", "Buffers", "SReclaimable"))
    swap_total = info.get("SwapTotal", 0)
    return {
        "memory_total_mib": info.get("MemTotal", 0) // KIB_PER_MIB,
        "memory_free_mib": free // KIB_PER_MIB,
        "memory_available_mib": info.get("MemAvailable", info.get("MemFree", 0)) // KIB_PER_MIB,
        "swap_total_mib": swap_total // KIB_PER_MIB,
        "swap_used_mib": max(0, swap_total - info.get("SwapFree", 0)) // KIB_PER_MIB,
    }


def guest_cpu_pct(before_ns: int | None, after_ns: int, seconds: float, vcpus: int) -> float:
    """A guest's CPU time over ``seconds`` as % of its vCPUs."""
    if before_ns is None or seconds <= 0 or vcpus <= 0 or after_ns < before_ns:
        return 0.0
    return round(min(100.0, 100.0 * (after_ns - before_ns) / (seconds * 1e9 * vcpus)), 2)


def guests_digest(guests: list[GuestFacts]) -> str:
    """Changes when a guest appears, goes, changes state, vCPUs, memory or policy (not CPU %)."""
    h = hashlib.blake2b(digest_size=12)
    for g in sorted(guests, key=lambda g: g.uuid):
        h.update(f"{g.uuid}|{g.name}|{g.state}|{g.vcpus}|{g.memory_mib}|{g.max_memory_mib}|{g.has_policy}|"
                 f"{g.dedicated}|{g.dedicated_cpus}|{g.pinned}\n".encode())
    return h.hexdigest()


def wanted_cpus(policy: GuestPolicy | None) -> int:
    """Dedicated CPUs a policy asks for: its count (one more with emulator isolate), or its explicit set's size."""
    if policy is None or policy.dedicated is None:
        return 0
    if isinstance(policy.dedicated, int):
        return policy.dedicated + (1 if policy.emulator == "isolate" else 0)
    return cpuset.count(policy.dedicated)


def pinned(policy: GuestPolicy | None) -> bool:
    """The policy pins vCPUs or the emulator to given pCPUs (a balancer must not move the guest)."""
    return policy is not None and bool(policy.vcpu_pins or policy.emulator_pin)


def dedicated_summary(pool: frozenset[int], allocations: dict[str, frozenset[int]],
                      policies: dict[str, GuestPolicy | None], topology: Topology | None = None) -> dict:
    """The host's dedicated-CPU fields: pool size, free CPUs, per NUMA node its free CPUs and free whole cores,
    and per known guest what it wants (with its thread, NUMA and emulator policies) and holds."""
    allocated = frozenset[int]().union(*allocations.values())
    guests = {u: DedicatedGuest(wanted=wanted_cpus(p), held=len(allocations.get(u, ())), thread_policy=p.thread_policy,
                                numa=p.numa, emulator=p.emulator)
              for u, p in policies.items() if p is not None and wanted_cpus(p)}
    for uuid, cpus in allocations.items():
        guests.setdefault(uuid, DedicatedGuest(wanted=len(cpus), held=len(cpus)))
    free = frozenset(pool - allocated)
    topology = topology if topology is not None else flat(pool | allocated)
    whole = {n: [c for c in topology.cores() if c <= pool and c <= free and topology.node_of(min(c)) == n]
             for n in topology.nodes()}  # per NUMA node, the cores of the pool whose every thread is free
    nodes = [DedicatedNode(node=n, free_cpus=len(topology.node_cpus(n) & free), free_cores=len(whole[n]),
                           free_core_cpus=sum(map(len, whole[n])))
             for n in topology.nodes() if topology.node_cpus(n) & pool]
    return {"dedicated_pool_cpus": len(pool), "dedicated_free_cpus": len(free), "dedicated_nodes": nodes,
            "dedicated_guests": guests}


def topology_facts(topology: Topology) -> dict[str, int]:
    """Sockets, cores per socket and threads per core, counted from the CPUs the topology lists (libvirt's
    ``host/cpu/topology`` counts sockets per NUMA node, not per host)."""
    sockets = topology.socket_cpus()
    cores = max((len({topology.core_of(c) for c in cpus}) for cpus in sockets.values()), default=0)
    return {"sockets": len(sockets), "cores": cores, "threads": topology.threads_per_core()}
