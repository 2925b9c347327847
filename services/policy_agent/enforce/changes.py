"""Policy changes asked for by a request (CLI, bus, gateway): set, validated whole and rolled back when
libvirt refuses it, and delete, which puts the guest back on the shared set.

A collaborator of the :class:`~.enforcer.Enforcer`: it reads guests and keeps allocations, metadata and
pins consistent through the enforcer's state, under the enforcer's lock (the enforcer itself keeps guests
at their policy on events and sweeps).
"""

from __future__ import annotations

import logging
import time

import libvirt

from vmsched.cpuset import CpuSet

from .. import metrics
from ..errors import ApplyError, GuestNotFound, PolicyError
from ..policy.model import DEFAULT_SHARES, GuestPolicy
from ..policy.validation import Desired, GuestInfo, check_policy, desired_for
from ..virt import metadata
from ..virt.domxml import DomainXml
from ..virt.snapshot import Snapshot
from .enforcer import Enforcer

log = logging.getLogger(__name__)


class PolicyChanges:
    def __init__(self, enforcer: Enforcer) -> None:
        self.enforcer = enforcer

    def set_policy(self, conn: "libvirt.virConnect", key: str, policy: GuestPolicy,
                   problems: list[str] | None = None) -> dict:
        """Validate and apply ``policy``. ``problems`` are the request's own errors found while parsing it
        (``policy`` is then made of its valid fields): refused together with the host-fit problems."""
        e = self.enforcer
        with e.lock:
            dom = e.lookup(conn, key)
            snap = e.read(dom)
            src = e.source(snap)
            info = GuestInfo(snap.uuid, snap.name, src.nvcpus)
            e.inv.upsert(snap.uuid, snap.name)  # known by name before its define event is handled: cycles close
            try:
                checked = check_policy(policy, info, e.pools, e.inv.graph(), e.inv.resolve, e.inv.name_of)
            except PolicyError as exc:
                metrics.APPLICATIONS.labels("refused").inc()
                raise PolicyError([*(problems or []), *exc.errors]) from None
            if problems:
                metrics.APPLICATIONS.labels("refused").inc()
                raise PolicyError(problems)
            if e.release_on_stop and not snap.active and policy.dedicated is not None:
                # validated now; the CPUs are allocated when the guest starts
                checked.allocation = None
                stopped = policy.model_copy(update={"dedicated": None, "vcpu_pins": {}})
                checked.desired = desired_for(stopped, info, e.pools, None)
            if e.tuned is not None:
                e.tuned.drop(snap.uuid)  # a new static policy: the tuners start again from it
            old_alloc = e.pools.allocations.get(snap.uuid)
            hint = metadata.AllocationHint(e.host_id, checked.allocation, e.pools.pool) if checked.allocation else None
            store = e.transient if not snap.persistent else None
            old_stored = store.get(snap.uuid) if store is not None else None
            try:
                if store is not None:
                    store.put(snap.uuid, snap.name, policy)  # on disk first: it must outlive the guest
                metadata.write(dom, policy, hint)
                result = e.applier.verify_and_repair(dom, checked.desired, snap.active, snap.persistent)
            except (ApplyError, libvirt.libvirtError) as exc:
                self._rollback(snap, src, old_alloc)
                if store is not None:
                    store.restore(snap.uuid, old_stored)
                metrics.APPLICATIONS.labels("error").inc()
                raise ApplyError(f"applying the policy of {snap.name!r} failed, previous policy restored: {exc}") from exc
            if checked.allocation:
                e.pools.assign(snap.uuid, snap.name, checked.allocation)
            else:
                e.pools.release(snap.uuid)
            e.save()
            g = e.inv.upsert(snap.uuid, snap.name)
            g.policy, g.hint, g.nvcpus, g.desired = policy, hint, src.nvcpus, checked.desired
            g.status, g.error, g.applied_at = "applied", None, time.time()
            e.overlaps.forget(snap.uuid)
            g.warnings = [*checked.warnings, *result.deferred]
            metrics.APPLICATIONS.labels("ok").inc()
            e.update_gauges()
            log.info("policy of %r set%s", snap.name, f": {', '.join(result.all())}" if result.changed else "")
            e.publish("applied", {"guest": snap.name, "uuid": snap.uuid, "trigger": "set",
                                  "changes": result.all(), "latency": None})
            return e.view(g)

    def _rollback(self, snap: Snapshot, src: DomainXml, old_alloc: CpuSet | None) -> None:
        e = self.enforcer
        try:
            if src.policy is not None:
                metadata.write(snap.dom, src.policy, src.hint)
            else:
                metadata.clear(snap.dom)
            g = e.inv.get(snap.uuid)
            desired = g.desired if g is not None and g.desired is not None else None
            if desired is not None:
                e.applier.verify_and_repair(snap.dom, desired, snap.active, snap.persistent)
        except (ApplyError, libvirt.libvirtError) as exc:
            log.error("rolling back the policy of %r failed (the next sweep retries): %s", snap.name, exc)

    def delete_policy(self, conn: "libvirt.virConnect", key: str) -> dict:
        e = self.enforcer
        with e.lock:
            try:
                dom = e.lookup(conn, key)
            except GuestNotFound:
                stored = e.transient.find(key) if e.transient is not None else None
                if stored is None:
                    raise
                e.transient.remove(stored.uuid)
                log.info("stored policy of transient guest %r (%s, not running) deleted", stored.name, stored.uuid)
                return {"guest": stored.name, "uuid": stored.uuid, "deleted": True}
            snap = e.read(dom)
            old = e.source(snap).policy
            if old is None and e.pools.allocations.get(snap.uuid) is None:
                return {"guest": snap.name, "uuid": snap.uuid, "deleted": False}
            if e.transient is not None:
                e.transient.remove(snap.uuid)  # first: a failure below must not bring it back
            metadata.clear(dom)
            e.pools.release(snap.uuid)
            e.save()
            info = GuestInfo(snap.uuid, snap.name, e.source(snap).nvcpus)
            base = desired_for(None, info, e.pools, None, confine=True)
            resets: dict[str, int] = {}
            if old is not None and old.weight is not None:
                resets["cpu_shares"] = DEFAULT_SHARES
            if old is not None and old.effective_quota() is not None:
                resets["vcpu_quota"] = -1
            desired = Desired(base.vcpus, base.emulator, resets)
            try:
                e.applier.verify_and_repair(dom, desired, snap.active, snap.persistent)
            except (ApplyError, libvirt.libvirtError) as exc:
                metrics.APPLICATIONS.labels("error").inc()
                raise ApplyError(f"policy of {snap.name!r} removed, but resetting its pins failed: {exc}") from exc
            g = e.inv.upsert(snap.uuid, snap.name)
            g.policy, g.hint, g.status, g.error, g.warnings = None, None, "unmanaged", None, []
            g.desired = desired_for(None, info, e.pools, None)
            metrics.APPLICATIONS.labels("ok").inc()
            e.update_gauges()
            log.info("policy of %r deleted", snap.name)
            e.publish("applied", {"guest": snap.name, "uuid": snap.uuid, "trigger": "delete",
                                  "changes": [], "latency": None})
            return {"guest": snap.name, "uuid": snap.uuid, "deleted": True}
