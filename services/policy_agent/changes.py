"""Policy changes asked for by a request (CLI, bus, gateway): set, validated whole and rolled back when
libvirt refuses it, and delete, which puts the guest back on the shared set.

The requests' half of the enforcer, mixed into :class:`enforce.Enforcer` (which holds the state named
below and the reading and bookkeeping methods); the other half keeps guests at their policy on events
and sweeps. Both run under the enforcer's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import libvirt

from . import metrics
from .policy.allocation import Pools
from .policy.cpuset import CpuSet
from .policy.errors import ApplyError, GuestNotFound, PolicyError
from .policy.inventory import Guest, Inventory
from .policy.model import DEFAULT_SHARES, GuestPolicy
from .policy.tuning.state import TunedState
from .policy.validation import Desired, GuestInfo, check_policy, desired_for
from .transient import TransientPolicies
from .virt import metadata
from .virt.apply import Applier
from .virt.domxml import DomainXml
from .virt.snapshot import Snapshot

log = logging.getLogger(__name__)


class PolicyChanges:
    host_id: str
    pools: Pools
    inv: Inventory
    applier: Applier
    publish: Callable[[str, dict], None]
    save: Callable[[], None]
    release_on_stop: bool
    transient: TransientPolicies | None
    tuned: TunedState | None
    lock: threading.RLock
    # the enforcer's reading and bookkeeping
    lookup: Callable[["libvirt.virConnect", str], "libvirt.virDomain"]
    read: Callable[["libvirt.virDomain"], Snapshot]
    _metadata_of: Callable[[Snapshot], DomainXml]
    update_gauges: Callable[[], None]
    view: Callable[[Guest], dict]

    def set_policy(self, conn: "libvirt.virConnect", key: str, policy: GuestPolicy,
                   problems: list[str] | None = None) -> dict:
        """Validate and apply ``policy``. ``problems`` are the request's own errors found while parsing it
        (``policy`` is then made of its valid fields): refused together with the host-fit problems."""
        with self.lock:
            dom = self.lookup(conn, key)
            snap = self.read(dom)
            src = self._metadata_of(snap)
            info = GuestInfo(snap.uuid, snap.name, src.nvcpus)
            try:
                checked = check_policy(policy, info, self.pools, self.inv.graph(), self.inv.resolve,
                                       self.inv.name_of)
            except PolicyError as exc:
                metrics.APPLICATIONS.labels("refused").inc()
                raise PolicyError([*(problems or []), *exc.errors]) from None
            if problems:
                metrics.APPLICATIONS.labels("refused").inc()
                raise PolicyError(problems)
            if self.release_on_stop and not snap.active and policy.dedicated is not None:
                # validated now; the CPUs are allocated when the guest starts
                checked.allocation = None
                stopped = policy.model_copy(update={"dedicated": None, "vcpu_pins": {}})
                checked.desired = desired_for(stopped, info, self.pools, None)
            if self.tuned is not None:
                self.tuned.drop(snap.uuid)  # a new static policy: the tuners start again from it
            old_alloc = self.pools.allocations.get(snap.uuid)
            hint = metadata.AllocationHint(self.host_id, checked.allocation, self.pools.pool) if checked.allocation else None
            store = self.transient if not snap.persistent else None
            old_stored = store.get(snap.uuid) if store is not None else None
            try:
                if store is not None:
                    store.put(snap.uuid, snap.name, policy)  # on disk first: it must outlive the guest
                metadata.write(dom, policy, hint)
                result = self.applier.verify_and_repair(dom, checked.desired, snap.active, snap.persistent)
            except (ApplyError, libvirt.libvirtError) as exc:
                self._rollback(snap, src, old_alloc)
                if store is not None:
                    store.restore(snap.uuid, old_stored)
                metrics.APPLICATIONS.labels("error").inc()
                raise ApplyError(f"applying the policy of {snap.name!r} failed, previous policy restored: {exc}") from exc
            if checked.allocation:
                self.pools.assign(snap.uuid, snap.name, checked.allocation)
            else:
                self.pools.release(snap.uuid)
            self.save()
            g = self.inv.upsert(snap.uuid, snap.name)
            g.policy, g.hint, g.nvcpus, g.desired = policy, hint, src.nvcpus, checked.desired
            g.status, g.error, g.warnings, g.applied_at = "applied", None, checked.warnings, time.time()
            metrics.APPLICATIONS.labels("ok").inc()
            self.update_gauges()
            log.info("policy of %r set%s", snap.name, f": {', '.join(result.all())}" if result.changed else "")
            self.publish("applied", {"guest": snap.name, "uuid": snap.uuid, "trigger": "set",
                                     "changes": result.all(), "latency": None})
            return self.view(g)

    def _rollback(self, snap: Snapshot, src: DomainXml, old_alloc: CpuSet | None) -> None:
        try:
            if src.policy is not None:
                metadata.write(snap.dom, src.policy, src.hint)
            else:
                metadata.clear(snap.dom)
            g = self.inv.get(snap.uuid)
            desired = g.desired if g is not None and g.desired is not None else None
            if desired is not None:
                self.applier.verify_and_repair(snap.dom, desired, snap.active, snap.persistent)
        except (ApplyError, libvirt.libvirtError) as exc:
            log.error("rolling back the policy of %r failed (the next sweep retries): %s", snap.name, exc)

    def delete_policy(self, conn: "libvirt.virConnect", key: str) -> dict:
        with self.lock:
            try:
                dom = self.lookup(conn, key)
            except GuestNotFound:
                stored = self.transient.find(key) if self.transient is not None else None
                if stored is None:
                    raise
                self.transient.remove(stored.uuid)
                log.info("stored policy of transient guest %r (%s, not running) deleted", stored.name, stored.uuid)
                return {"guest": stored.name, "uuid": stored.uuid, "deleted": True}
            snap = self.read(dom)
            old = self._metadata_of(snap).policy
            if old is None and self.pools.allocations.get(snap.uuid) is None:
                return {"guest": snap.name, "uuid": snap.uuid, "deleted": False}
            if self.transient is not None:
                self.transient.remove(snap.uuid)  # first: a failure below must not bring it back
            metadata.clear(dom)
            self.pools.release(snap.uuid)
            self.save()
            info = GuestInfo(snap.uuid, snap.name, self._metadata_of(snap).nvcpus)
            base = desired_for(None, info, self.pools, None, confine=True)
            resets: dict[str, int] = {}
            if old is not None and old.weight is not None:
                resets["cpu_shares"] = DEFAULT_SHARES
            if old is not None and old.effective_quota() is not None:
                resets["vcpu_quota"] = -1
            desired = Desired(base.vcpus, base.emulator, resets)
            try:
                self.applier.verify_and_repair(dom, desired, snap.active, snap.persistent)
            except (ApplyError, libvirt.libvirtError) as exc:
                metrics.APPLICATIONS.labels("error").inc()
                raise ApplyError(f"policy of {snap.name!r} removed, but resetting its pins failed: {exc}") from exc
            g = self.inv.upsert(snap.uuid, snap.name)
            g.policy, g.hint, g.status, g.error, g.warnings = None, None, "unmanaged", None, []
            g.desired = desired_for(None, info, self.pools, None)
            metrics.APPLICATIONS.labels("ok").inc()
            self.update_gauges()
            log.info("policy of %r deleted", snap.name)
            self.publish("applied", {"guest": snap.name, "uuid": snap.uuid, "trigger": "delete",
                                     "changes": [], "latency": None})
            return {"guest": snap.name, "uuid": snap.uuid, "deleted": True}
