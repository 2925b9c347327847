"""Who may run where, as it is in force: guests pinned by their manager, and dedicated CPUs shared.

Pure functions over the domains' XML and the pools, and the reporter the
enforcer calls at the end of every sweep (log, metric, event and error state,
each once per change).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from .. import metrics
from ..guests.inventory import Guest, Inventory
from ..policy.allocation import Pools
from ..policy.validation import Desired
from ..virt.domxml import DomainXml
from ..virt.snapshot import Snapshot

log = logging.getLogger(__name__)


def manager_pinned(xml: DomainXml, host: CpuSet) -> bool:
    """The definition carries its own placement (``<vcpupin>``, ``<emulatorpin>``, ``<vcpu cpuset>``) that does
    not look like the agent's confinement: its manager (oVirt/vdsm, an admin) pins the guest.

    The agent confines a guest by putting the emulator and every vCPU on one set (the shared set of the
    time; the test driver keeps only the emulator pin in the config): a definition with an
    ``<emulatorpin>`` whose placements are all that one set (every vCPU pinned to it, or none) is taken
    for the agent's own confinement, and confined again to the current shared set. Anything else is the
    manager's (so a manager that pins the emulator and every vCPU of a guest to one same set is not
    recognised as such). A placement on every host CPU restricts nothing and does not count."""
    placed = [*xml.vcpupins.values(), *(c for c in (xml.emulatorpin, xml.vcpu_cpuset) if c is not None)]
    if all(cpus >= host for cpus in placed):  # every host CPU: no restriction at all
        return False
    uniform = (xml.emulatorpin is not None and len(set(placed)) == 1
               and (not xml.vcpupins or set(xml.vcpupins) >= set(range(xml.nvcpus))))
    return not uniform


def placement(desired: Desired | None, xml: DomainXml, host: CpuSet) -> dict[str, CpuSet]:
    """Where each thread group of a guest may run: what the agent enforces, else what its XML says."""
    vcpus = desired.vcpus if desired is not None and desired.vcpus is not None else xml.effective_vcpus(host)
    emulator = desired.emulator if desired is not None and desired.emulator is not None \
        else xml.effective_emulator(host)
    return {**{f"vcpu{i}": c for i, c in sorted(vcpus.items())}, "emulator": emulator}


def describe(pools: Pools, guests: dict[str, dict[str, CpuSet]], name_of: dict[str, str]) -> dict[tuple[str, str], str]:
    """Every thread group of a guest allowed on a CPU dedicated to another guest: (guest, holder) -> one message
    naming both and every thread group involved.

    ``guests``: uuid -> :func:`placement` of the running guests."""
    out = {}
    for uuid, where in sorted(guests.items()):
        for holder, held in sorted(pools.allocations.items()):
            shared = [(what, frozenset(cpus & held)) for what, cpus in where.items() if holder != uuid and cpus & held]
            if shared:
                cpus = frozenset().union(*(c for _, c in shared))
                parts = ", ".join(f"{what} on {cpuset.fmt(c)}" for what, c in shared)
                out[(uuid, holder)] = (f"dedicated CPUs {cpuset.fmt(cpus)} of guest {name_of.get(holder, holder)!r}"
                                       f" are shared with guest {name_of.get(uuid, uuid)!r} ({parts})")
    return out


class OverlapReporter:
    """Dedicated CPUs that another running guest may also run on (after a sweep's repairs), and guests
    pinned by their manager into the dedicated pool: logged, counted, and an error state on every guest
    involved, each reported once per change."""

    def __init__(self, publish: Callable[[str, dict], None]):
        self.publish = publish
        self._warned: list[str] = []
        self._seen: dict[str, str] = {}  # guest -> the overlap last reported

    def keep(self, g: Guest) -> None:
        """After an event's repair between sweeps: the overlap the last sweep found on the guest stays on it
        until a sweep finds it gone."""
        overlap = self._seen.get(g.uuid)
        if overlap is not None:
            _mark(g, overlap)

    def forget(self, uuid: str) -> None:
        """The guest's policy was set: the next sweep says again whether it overlaps."""
        self._seen.pop(uuid, None)

    def report(self, snaps: Iterable[Snapshot], inv: Inventory, pools: Pools, host: CpuSet,
               foreign: set[str]) -> list[str]:
        """Report what is in force now (under the enforcer's lock); returns every overlap message."""
        running: dict[str, dict[str, CpuSet]] = {}
        foreign_in_pool = []
        for snap in snaps:
            g = inv.get(snap.uuid)
            if g is None or snap.live is None:
                continue
            running[snap.uuid] = placement(g.desired, snap.live, host)
            if g.policy is None and snap.uuid in foreign and pools.pool:
                if any(c & pools.pool for c in running[snap.uuid].values()):
                    foreign_in_pool.append(g.name)
        names = {u: (inv.get(u).name if inv.get(u) else pools.name(u))  # type: ignore[union-attr]
                 for u in set(running) | set(pools.allocations)}
        found = describe(pools, running, names)
        per_guest: dict[str, list[str]] = {}
        for (uuid, holder), message in sorted(found.items()):
            per_guest.setdefault(uuid, []).append(message)
            per_guest.setdefault(holder, []).append(message)
        for who, msgs in per_guest.items():
            g = inv.get(who)
            if g is None:
                continue
            text = "; ".join(msgs)
            if self._seen.get(who) != text:
                log.error("%s", text)
                self.publish("error", {"guest": g.name, "uuid": g.uuid, "error": text})
                metrics.ERRORS.labels("overlap").inc()
            _mark(g, text)
        self._seen = {u: "; ".join(m) for u, m in per_guest.items()}
        metrics.DEDICATED_OVERLAPS.set(len({u for u, _ in found}))
        metrics.FOREIGN_IN_POOL.set(len(foreign_in_pool))
        if foreign_in_pool and sorted(foreign_in_pool) != self._warned:
            log.warning("guests pinned by their manager (no vmsched policy) into the dedicated pool %s: %s;"
                        " they are left alone, give them a vmsched policy or change their pinning",
                        cpuset.fmt(pools.pool), ", ".join(sorted(foreign_in_pool)))
        self._warned = sorted(foreign_in_pool)
        return sorted(set(found.values()))


def _mark(g: Guest, overlap: str) -> None:
    """An error state on the guest that names ``overlap``, after any error it has already."""
    g.status = "error"
    if not g.error:
        g.error = overlap
    elif overlap not in g.error:
        g.error = f"{g.error}; {overlap}"
