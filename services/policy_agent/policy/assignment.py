"""Which dedicated CPUs a guest gets: whole sockets, then whole cores, then threads, aligned to NUMA nodes.

Pure and deterministic, like kubelet's ``cpu_assignment``: the same host, pool, holders and request always
give the same CPUs, and a guest keeps what it holds whenever its request still allows it.

The thread policy says what a core may be shared with:

* ``prefer``: whole cores first, then single threads (taken from cores already in use before a whole one
  is broken);
* ``require``: whole cores only, every thread of each in the pool and free; the threads the guest does not
  use stay held (``ceil(n / threads)`` cores);
* ``isolate``: one thread per core, the core's other threads held for this guest and given to nobody.

The NUMA policy says where: ``any`` takes one node when the request fits in one (the node holding most of
what the guest has, then the tightest fit), several otherwise; ``strict`` takes one node or refuses.

:func:`roles` then says which held CPU runs what: the vCPUs, the emulator threads (``emulator: isolate``)
and the threads held idle.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Iterable

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from ..errors import PolicyError
from ..plural import plural
from .topology import Topology


@dataclass(frozen=True)
class Request:
    """``cpus`` CPUs the guest runs on (its vCPUs, plus one with ``emulator: isolate``)."""

    cpus: int
    threads: str = "prefer"
    numa: str = "any"


@dataclass(frozen=True)
class Roles:
    """What each held CPU is for."""

    vcpus: tuple[int, ...]  # vCPU i runs on vcpus[i] (fewer than the guest's vCPUs: the rest share the held CPUs)
    emulator: int | None  # the emulator threads' own CPU (emulator: isolate)
    reserved: CpuSet  # held for the guest and run by nothing (isolate's sibling threads)

    def for_vcpus(self, held: CpuSet) -> CpuSet:
        """Where the guest's vCPUs may be pinned: what it holds but the emulator's CPU and the reserved threads."""
        return frozenset(held - self.reserved - ({self.emulator} if self.emulator is not None else set()))


def assign(topology: Topology, pool: CpuSet, taken: CpuSet, current: CpuSet, request: Request, who: str) -> CpuSet:
    """The CPUs a guest holding ``current`` gets for ``request``, when others hold ``taken``; raises PolicyError."""
    free = frozenset((pool & topology.online) - taken)
    current = frozenset(current & free)
    cores = _eligible_cores(topology, pool, free, request.threads)
    if _still_fits(topology, cores, current, request):
        return current  # what it holds serves the request as it is: it keeps it
    nodes = _choose_nodes(topology, cores, free, current, request, who)
    inside = frozenset().union(*(topology.node_cpus(n) for n in nodes))
    if request.threads == "prefer":
        return _take_threads(topology, [c & inside for c in cores if c & inside], free & inside, current, request.cpus)
    return _take_cores(topology, [c for c in cores if c <= inside], current, request)


def check_set(topology: Topology, pool: CpuSet, taken: CpuSet, wanted: CpuSet, request: Request) -> tuple[CpuSet, list[str]]:
    """An explicit set against the thread and NUMA policies: (what the guest holds with it, every problem)."""
    what = f"dedicated set {cpuset.fmt(wanted)}"
    problems: list[str] = []
    held = set(wanted)
    if request.threads == "require":
        for core in _distinct(topology.core_of(c) for c in sorted(wanted & topology.online)):
            if not core <= wanted:
                problems.append(f"{what}: thread_policy require needs whole cores; the core of CPUs"
                                f" {cpuset.fmt(core)} is only partly in it (add {cpuset.fmt(core - wanted)})")
    elif request.threads == "isolate":
        for core in _distinct(topology.core_of(c) for c in sorted(wanted & topology.online)):
            if len(core & wanted) > 1:
                problems.append(f"{what}: thread_policy isolate takes one thread per core; CPUs"
                                f" {cpuset.fmt(core & wanted)} are threads of one core")
            siblings = core - wanted
            if siblings - pool:
                problems.append(f"{what}: thread_policy isolate holds the sibling threads {cpuset.fmt(siblings - pool)}"
                                f" for this guest, but they are not in the dedicated pool {cpuset.fmt(pool)}")
            elif siblings & taken:
                problems.append(f"{what}: thread_policy isolate holds the sibling threads"
                                f" {cpuset.fmt(siblings & taken)} for this guest, but another guest holds them")
            held |= siblings
    if request.numa == "strict":
        spanned = sorted({topology.node_of(c) for c in wanted if c in topology.cpus})
        if len(spanned) > 1:
            problems.append(f"{what} spans NUMA nodes {', '.join(map(str, spanned))}; numa strict needs one node")
    if len(wanted) < request.cpus:
        problems.append(f"{what} has {plural(len(wanted), 'CPU')}, fewer than the {request.cpus} the guest runs on"
                        " (its vCPUs and, with emulator isolate, one for the emulator threads)")
    return frozenset(held), problems


def roles(topology: Topology, held: CpuSet, nvcpus: int, threads: str = "prefer", emulator: str = "share",
          explicit: CpuSet | None = None) -> Roles:
    """Which held CPU runs which vCPU, the emulator threads (``emulator: isolate``), and which are reserved."""
    if explicit is not None:
        usable = sorted(explicit & held)
    elif threads == "isolate":
        usable = sorted(min(core & held) for core in _distinct(topology.core_of(c) & held for c in sorted(held)))
    elif threads == "require":
        usable = [c for core in _distinct(topology.core_of(c) & held for c in sorted(held)) for c in sorted(core)]
    else:
        usable = sorted(held)
    vcpus = tuple(usable[:nvcpus])
    emu = usable[nvcpus] if emulator == "isolate" and len(usable) > nvcpus else None
    reserved = frozenset(held - set(usable)) if threads == "isolate" else frozenset()
    return Roles(vcpus, emu, reserved)


def node_of_set(topology: Topology, cpus: CpuSet) -> int | None:
    """The one NUMA node ``cpus`` lie in, or None when they span several."""
    nodes = {topology.node_of(c) for c in cpus if c in topology.cpus}
    return nodes.pop() if len(nodes) == 1 else None


# --- internals ---------------------------------------------------------------------------------------
def _distinct(cores: Iterable[CpuSet]) -> list[CpuSet]:
    return list(dict.fromkeys(c for c in cores if c))


def _eligible_cores(topology: Topology, pool: CpuSet, free: CpuSet, threads: str) -> list[CpuSet]:
    """Cores the request may use: with a free thread (prefer), or whole in the pool and free (require, isolate)."""
    cores = topology.cores()
    if threads == "prefer":
        return [c & free for c in cores if c & free]
    return [c for c in cores if c <= pool and c <= free]


def _still_fits(topology: Topology, cores: list[CpuSet], current: CpuSet, request: Request) -> bool:
    """``current`` is, as it is, an answer to ``request``: the right size, whole eligible cores where the thread
    policy wants them, one node with numa strict."""
    if not current or (request.numa == "strict" and len({topology.node_of(c) for c in current}) > 1):
        return False
    if request.threads == "prefer":
        return len(current) == request.cpus
    mine = [c for c in cores if c & current]
    if frozenset().union(*mine) != current:  # a CPU of a core that is not whole and free
        return False
    if request.threads == "isolate":
        return len(mine) == request.cpus
    size = sum(len(c) for c in mine)
    return size >= request.cpus and size - min(len(c) for c in mine) < request.cpus


def _capacity(cores: list[CpuSet], node_cpus: CpuSet, request: Request) -> int:
    """How much of the request a node can serve: CPUs (prefer, require) or cores (isolate)."""
    inside = [c for c in cores if c <= node_cpus] if request.threads != "prefer" else [c & node_cpus for c in cores]
    return sum(1 for c in inside if c) if request.threads == "isolate" else sum(len(c) for c in inside)


def _choose_nodes(topology: Topology, cores: list[CpuSet], free: CpuSet, current: CpuSet, request: Request,
                  who: str) -> list[int]:
    nodes = topology.nodes()
    cap = {n: _capacity(cores, topology.node_cpus(n), request) for n in nodes}
    mine = {n: len(current & topology.node_cpus(n)) for n in nodes}
    fits = [n for n in nodes if cap[n] >= request.cpus]
    if fits:
        return [min(fits, key=lambda n: (-mine[n], cap[n], n))]
    if request.numa == "any" and sum(cap.values()) >= request.cpus:
        spread, got = [], 0
        for n in sorted(nodes, key=lambda n: (-mine[n], -cap[n], n)):
            if got >= request.cpus:
                break
            if cap[n]:
                spread.append(n)
                got += cap[n]
        return sorted(spread)
    raise PolicyError(_refusal(topology, cap, request, who))


def _refusal(topology: Topology, cap: dict[int, int], request: Request, who: str) -> str:
    unit = "free"
    if request.threads == "isolate":
        what = (f"{plural(request.cpus, 'whole core')} (one thread of each for it, the other threads held:"
                " thread_policy isolate)")
        unit = "free whole cores"
    elif request.threads == "require":
        per = topology.threads_per_core()
        what = f"{plural(math.ceil(request.cpus / per), 'whole core')} ({plural(request.cpus, 'CPU')}, thread_policy require)"
        unit = "free CPUs on whole cores"
    else:
        what = plural(request.cpus, "dedicated CPU")
    where = " in one NUMA node (numa strict)" if request.numa == "strict" else ""
    nodes = ", ".join(f"node {n} has {c}" for n, c in sorted(cap.items()))
    return f"guest {who!r} needs {what}{where}; {unit}: {nodes}"


def _take_cores(topology: Topology, cores: list[CpuSet], current: CpuSet, request: Request) -> CpuSet:
    """Whole cores: the guest's own first, then whole free sockets, then cores of the fullest socket; none beyond
    the need (what :func:`_still_fits` keeps when asked again)."""
    free_in_socket = collections.Counter(topology.cpus[min(core)].socket for core in cores)
    socket_size = {s: len({topology.core_of(c) for c in cpus}) for s, cpus in topology.socket_cpus().items()}
    whole_sockets = {s for s, n in free_in_socket.items() if n == socket_size.get(s)}

    def order(core: CpuSet) -> tuple:
        s = topology.cpus[min(core)].socket
        return (not core & current, s not in whole_sockets, free_in_socket[s], s, min(core))

    taken: list[CpuSet] = []
    got = 0
    want = request.cpus
    ordered = sorted(cores, key=order)
    # a whole free socket when the request covers it
    for s in sorted(whole_sockets):
        socket_cores = [c for c in ordered if topology.cpus[min(c)].socket == s]
        size = len(socket_cores) if request.threads == "isolate" else sum(len(c) for c in socket_cores)
        if not any(c & current for c in socket_cores) and want - got >= size:
            taken += socket_cores
            got += size
    for core in ordered:
        if got >= want:
            break
        if core in taken:
            continue
        taken.append(core)
        got += 1 if request.threads == "isolate" else len(core)
    if request.threads == "require":  # no core beyond the need (a core of one thread may be): smallest first
        for core in sorted(taken, key=lambda c: (len(c), bool(c & current))):
            if got - len(core) >= want:
                taken.remove(core)
                got -= len(core)
    return frozenset().union(*taken)


def _take_threads(topology: Topology, cores: list[CpuSet], free: CpuSet, current: CpuSet, n: int) -> CpuSet:
    """prefer: what the guest holds, then whole free cores, then single threads of cores already in use."""
    out = set(sorted(current & free)[:n])
    whole = [c for c in cores if topology.core_of(min(c)) == c and not c & out]
    for core in sorted(whole, key=min):
        if len(out) + len(core) > n:
            continue
        out |= core
    while len(out) < n:  # a thread of its own cores, then of cores others use, before breaking a whole free core

        def order(cpu: int) -> tuple[int, int]:
            core = topology.core_of(cpu)
            return (0 if core & out else 1 if not core <= free else 2, cpu)

        out.add(min(free - out, key=order))
    return frozenset(out)
