"""Host CPU pools: the dedicated pool, the shared set and who holds what.

Pure bookkeeping, no libvirt: the agent asks here for an allocation
(validated, not yet committed), then commits it once the guest's policy is
stored. Guests are keyed by UUID; names are kept for messages only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from ..errors import PolicyError
from ..plural import plural
from .assignment import Request, Roles, assign, check_set, roles
from .model import GuestPolicy
from .topology import Topology, flat


@dataclass(frozen=True)
class AllocationHint:
    """What a guest's metadata records of its allocation: the host, its CPUs and the pool at the time."""

    host: str
    cpus: frozenset[int]
    pool: frozenset[int]


@dataclass
class Pools:
    host_cpus: CpuSet
    pool: CpuSet = frozenset()
    allocations: dict[str, CpuSet] = field(default_factory=dict)  # uuid -> CPUs
    names: dict[str, str] = field(default_factory=dict)  # uuid -> guest name
    topology: Topology | None = None  # the host's cores and NUMA nodes (None: every CPU a core, one node)

    @property
    def topo(self) -> Topology:
        return self.topology if self.topology is not None else flat(self.host_cpus)

    # --- views ---------------------------------------------------------------
    @property
    def shared(self) -> CpuSet:
        return frozenset(self.host_cpus - self.pool)

    @property
    def allocated(self) -> CpuSet:
        return frozenset[int]().union(*self.allocations.values())

    @property
    def free(self) -> CpuSet:
        return frozenset(self.pool - self.allocated)

    def name(self, uuid: str) -> str:
        return self.names.get(uuid, uuid)

    def view(self) -> dict:
        return {
            "host_cpus": cpuset.fmt(self.host_cpus),
            "dedicated_pool": cpuset.fmt(self.pool),
            "shared": cpuset.fmt(self.shared),
            "free": cpuset.fmt(self.free),
            "allocated": cpuset.fmt(self.allocated),
            "allocations": {self.name(u): cpuset.fmt(c) for u, c in sorted(self.allocations.items())},
        }

    def topology_view(self, uses: dict[int, str] | None = None) -> dict:
        """The host's sockets, their NUMA nodes, cores and threads, each CPU with its state (shared, free,
        held) and, when held, its guest and what it runs there (``uses``: CPU -> "vcpu0", "emulator", ...)."""
        t, uses = self.topo, uses or {}
        holder = {c: u for u, cpus in self.allocations.items() for c in cpus}
        sockets: dict[int, dict[int, list[dict]]] = {}
        for core in t.cores():
            first = t.cpus[min(core)] if min(core) in t.cpus else None
            socket, node = (first.socket, first.node) if first is not None else (0, 0)
            threads = []
            for cpu in sorted(core):
                entry: dict = {"cpu": cpu, "state": "shared" if cpu not in self.pool else "free"}
                if cpu in holder:
                    entry.update(state="held", guest=self.name(holder[cpu]), use=uses.get(cpu, "idle"))
                threads.append(entry)
            sockets.setdefault(socket, {}).setdefault(node, []).append(
                {"core": first.core if first is not None else min(core), "threads": threads})
        memory = {c.id: c.memory_kib // 1024 for c in t.cells}
        return {"sockets": [{"socket": s, "nodes": [{"node": n, "memory_mib": memory.get(n, 0), "cores": cores}
                                                    for n, cores in sorted(nodes.items())]}
                            for s, nodes in sorted(sockets.items())],
                "offline": cpuset.fmt(t.offline)}

    # --- checks --------------------------------------------------------------
    def check_pool(self, pool: CpuSet) -> list[str]:
        errors = []
        gone = pool - self.host_cpus
        if gone:
            errors.append(
                f"dedicated pool {cpuset.fmt(pool)}: {cpuset.named(gone, 'does', 'do')} not exist on this host"
                f" (CPUs {cpuset.fmt(self.host_cpus)})"
            )
        elif pool and not (self.host_cpus - pool):
            errors.append(
                f"dedicated pool {cpuset.fmt(pool)} covers every host CPU: at least one CPU must stay shared"
            )
        return errors

    # --- requests ------------------------------------------------------------
    def request(self, uuid: str, name: str, dedicated: int | CpuSet, nvcpus: int, threads: str = "prefer",
                numa: str = "any", emulator: str = "share") -> CpuSet:
        """The CPUs ``uuid`` would hold for this request; raises PolicyError.

        A count is placed by :func:`assignment.assign` (NUMA-aligned, whole cores first, keeping what the
        guest holds); an explicit set must lie in the pool, not overlap another guest's allocation, and
        follow the thread and NUMA policies (:func:`assignment.check_set`). ``emulator: isolate`` asks for
        one more CPU, for the emulator threads.
        """
        errors: list[str] = []
        if not self.pool:
            raise PolicyError(
                f"guest {name!r} asks for dedicated CPUs but this host has no dedicated pool"
                " (set one with 'vmsched agent --dedicated-pool CPUSET' or 'vmsched policy pool CPUSET')"
            )
        current = self.allocations.get(uuid, frozenset())
        taken = self.allocated - current
        extra = 1 if emulator == "isolate" else 0
        if isinstance(dedicated, int):
            available = (self.free | current) & self.pool
            wanted = dedicated + extra
            if dedicated < nvcpus:
                errors.append(
                    f"dedicated count {dedicated} is smaller than the guest's {plural(nvcpus, 'vCPU')}"
                    " (a dedicated guest's vCPUs are pinned 1:1)"
                )
            if wanted > len(available):
                also = " (one more for the emulator threads: emulator isolate)" if extra else ""
                errors.append(
                    f"guest {name!r} asks for {plural(wanted, 'dedicated CPU')}{also} but only {len(available)}"
                    f" {'is' if len(available) == 1 else 'are'} free"
                    f" in the pool {cpuset.fmt(self.pool)}{self._holders(exclude=uuid)}"
                )
            if errors:
                raise PolicyError(errors)
            return assign(self.topo, self.pool, taken, current, Request(wanted, threads, numa), name)
        wanted_set = frozenset(dedicated)
        gone = wanted_set - self.host_cpus
        if gone:
            errors.append(f"dedicated set {cpuset.fmt(wanted_set)}: {cpuset.named(gone, 'does', 'do')} not exist on"
                          " this host")
        if outside := wanted_set - self.pool - gone:
            errors.append(
                f"dedicated set {cpuset.fmt(wanted_set)}: {cpuset.named(outside, 'is', 'are')} not in the host's"
                f" dedicated pool {cpuset.fmt(self.pool)}"
            )
        for other, held in sorted(self.allocations.items()):
            if other != uuid and (cpus := held & wanted_set):
                errors.append(
                    f"dedicated set {cpuset.fmt(wanted_set)}: {cpuset.named(cpus, 'is', 'are')} already dedicated"
                    f" to guest {self.name(other)!r}"
                )
        if len(wanted_set) < nvcpus:
            errors.append(
                f"dedicated set {cpuset.fmt(wanted_set)} has {plural(len(wanted_set), 'CPU')}, fewer than the guest's"
                f" {plural(nvcpus, 'vCPU')} (a dedicated guest's vCPUs are pinned 1:1)"
            )
        elif len(wanted_set) < nvcpus + extra:
            errors.append(
                f"dedicated set {cpuset.fmt(wanted_set)} has {plural(len(wanted_set), 'CPU')}: the guest's"
                f" {plural(nvcpus, 'vCPU')}"
                " and one for the emulator threads (emulator isolate) need one more"
            )
        held, problems = check_set(self.topo, self.pool, taken, wanted_set, Request(nvcpus + extra, threads, numa))
        errors.extend(problems)
        if errors:
            raise PolicyError(errors)
        return held

    def request_for(self, uuid: str, name: str, policy: GuestPolicy, nvcpus: int) -> CpuSet:
        """:meth:`request` for a policy with dedicated CPUs."""
        dedicated = policy.dedicated_set() or policy.dedicated
        assert dedicated is not None
        return self.request(uuid, name, dedicated, nvcpus, policy.thread_policy, policy.numa, policy.emulator)

    def roles(self, policy: GuestPolicy, allocation: CpuSet, nvcpus: int) -> Roles:
        """Which of a guest's dedicated CPUs runs its vCPUs, its emulator threads, and which are held idle."""
        return roles(self.topo, allocation, nvcpus, policy.thread_policy, policy.emulator, policy.dedicated_set())

    def _holders(self, exclude: str | None) -> str:
        held = [f"{cpuset.fmt(c)} to {self.name(u)!r}" for u, c in sorted(self.allocations.items()) if u != exclude]
        return f"; allocated: {', '.join(held)}" if held else ""

    # --- commits -------------------------------------------------------------
    def assign(self, uuid: str, name: str, cpus: CpuSet) -> None:
        self.allocations[uuid] = frozenset(cpus)
        self.names[uuid] = name

    def release(self, uuid: str) -> CpuSet | None:
        self.names.pop(uuid, None)
        return self.allocations.pop(uuid, None)

    def copy(self) -> "Pools":
        return Pools(self.host_cpus, self.pool, dict(self.allocations), dict(self.names), self.topology)

    def consistency_errors(self) -> list[str]:
        """What is wrong with this state (used to validate a checkpoint)."""
        errors = self.check_pool(self.pool)
        seen: dict[int, str] = {}
        for uuid, cpus in sorted(self.allocations.items()):
            if not cpus:
                errors.append(f"guest {self.name(uuid)!r} holds an empty allocation")
            if outside := cpus - self.pool:
                errors.append(f"guest {self.name(uuid)!r} holds {cpuset.named(outside)} outside the pool")
            for cpu in sorted(cpus):
                if cpu in seen:
                    errors.append(f"CPU {cpu} is allocated to both {self.name(seen[cpu])!r} and {self.name(uuid)!r}")
                seen[cpu] = uuid
        return errors


class Holder(Protocol):
    """A guest as pool planning sees it (the inventory's ``Guest`` is one)."""

    uuid: str
    name: str
    nvcpus: int
    policy: GuestPolicy | None

    @property
    def active(self) -> bool: ...


def plan_pool(pools: Pools, pool: CpuSet, guests: Iterable[Holder], release_on_stop: bool = False) -> Pools:
    """The pools after changing the dedicated pool to ``pool``.

    Explicit dedicated sets are placed first, then counts (each keeps what it
    can of its current CPUs). Then every policy's explicit pins are checked
    against the new pools: a guest without dedicated CPUs may not be pinned
    into the pool, a dedicated guest's pins must stay inside its allocation.
    Raises PolicyError naming every guest that conflicts with the new pool.
    """
    errors = pools.check_pool(pool)
    if errors:
        raise PolicyError(errors)
    new = Pools(pools.host_cpus, pool, topology=pools.topology)
    guests = list(guests)
    holders = [g for g in guests if g.policy is not None and g.policy.dedicated is not None
               and (g.uuid in pools.allocations or not release_on_stop or g.active)]
    holders.sort(key=lambda g: (0 if isinstance(g.policy.dedicated, str) else 1, g.name))  # type: ignore[union-attr]
    for g in holders:
        assert g.policy is not None
        old = pools.allocations.get(g.uuid, frozenset())
        if isinstance(g.policy.dedicated, int) and old & new.free:
            new.assign(g.uuid, g.name, old & new.free)  # keep what it can
        try:
            new.assign(g.uuid, g.name, new.request_for(g.uuid, g.name, g.policy, g.nvcpus))
        except PolicyError as exc:
            new.release(g.uuid)
            errors.extend(f"guest {g.name!r}: {e}" for e in exc.errors)
    for g in sorted(guests, key=lambda g: g.name):
        if g.policy is not None and (g.policy.dedicated is None or g.uuid in new.allocations):
            errors.extend(f"guest {g.name!r}: {e}"
                          for e in pin_conflicts(g.policy, new, new.allocations.get(g.uuid), g.nvcpus))
    if errors:
        raise PolicyError([f"dedicated pool {cpuset.fmt(pool) or '(none)'} refused"] + errors)
    return new


def pin_conflicts(policy: GuestPolicy, pools: Pools, allocation: CpuSet | None, nvcpus: int = 0) -> list[str]:
    """Explicit pins of ``policy`` that break the pools: pins into the dedicated pool of a guest without
    an allocation, pins of a dedicated guest outside the CPUs of its vCPUs (emulator: outside those and the
    shared set)."""
    out = []
    inside = pools.roles(policy, allocation, nvcpus).for_vcpus(allocation) if allocation else frozenset()
    for vcpu, text in sorted(policy.vcpu_pins.items()):
        cpus = cpuset.parse(text)
        if allocation is not None and cpus - inside:
            out.append(f"vCPU {vcpu} pin {text}: {cpuset.named(cpus - inside, 'is', 'are')} outside the guest's"
                       f" dedicated {cpuset.named(inside)}")
        elif allocation is None and cpus & pools.pool:
            out.append(f"vCPU {vcpu} pin {text}: {cpuset.named(cpus & pools.pool, 'is', 'are')} in the dedicated pool"
                       f" {cpuset.fmt(pools.pool)}")
    if policy.emulator_pin:
        emu = cpuset.parse(policy.emulator_pin)
        if bad := emu & pools.pool - inside:
            out.append(f"emulator pin {policy.emulator_pin}: {cpuset.named(bad, 'is', 'are')} in the dedicated pool"
                       f" {cpuset.fmt(pools.pool)} and not dedicated to this guest")
    return out
