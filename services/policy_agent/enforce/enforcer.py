"""Keep guests at their policy: one guest (an event), all of them (a sweep),
and the changes requests make: set, validated whole and rolled back when
libvirt refuses it, and delete, which puts the guest back on the shared set.

Everything here runs under the agent's lock, so allocations, metadata and
pins change together. Reads are one ``XMLDesc`` per scope; writes happen
only where the guest differs from what it should be, and only while its
definition is still the one the repair was decided from: when another
writer (an admin, the guest's manager) changed it meanwhile, the repair is
decided again from a new read (virt/apply.py says what is left of the race).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Callable

import libvirt

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from .. import metrics
from ..errors import ApplyError, DefinitionChanged, GuestNotFound, PolicyError
from ..guests.inventory import Guest, Inventory
from ..policy.allocation import Pools, pin_conflicts
from ..policy.model import DEFAULT_SHARES, GuestPolicy
from ..policy.validation import Desired, GuestInfo, check_policy, desired_for
from ..tuners.state import TunedState
from ..virt import metadata, snapshot
from ..virt.apply import Applier, Result
from ..virt.domxml import DomainXml
from ..virt.snapshot import Snapshot
from .overlaps import OverlapReporter, manager_pinned
from .transient import TransientPolicies

log = logging.getLogger(__name__)

Publish = Callable[[str, dict], None]
DRIFT_LOOP = (20, 10.0)  # restorations within seconds that mean a loop (a real one cycles ~20/s)
CHANGED_RETRIES = 3  # repairs decided again when another writer keeps changing the definition under them


class Enforcer:
    def __init__(self, machine: str, pools: Pools, inventory: Inventory, applier: Applier,
                 publish: Publish, save: Callable[[], None], transient: TransientPolicies,
                 release_on_stop: bool = False):
        self.machine = machine  # libvirt's host UUID: what allocation hints are written with
        self.pools = pools
        self.inv = inventory
        self.applier = applier
        self.publish = publish
        self.save = save
        self.release_on_stop = release_on_stop
        self.transient = transient  # policies of transient guests (no persistent definition to hold them)
        self.lock = threading.RLock()
        self._drift_times: dict[str, collections.deque[float]] = {}
        self._foreign: set[str] = set()  # guests left to their manager's own pinning (logged once)
        self.overlaps = OverlapReporter(publish)
        self.tuned = TunedState()  # the tuners' live values: part of the desired state (adaptive/loop.py)

    # --- reading -----------------------------------------------------------------
    def lookup(self, conn: "libvirt.virConnect", key: str) -> "libvirt.virDomain":
        return snapshot.lookup(conn, key, self.inv.resolve(key))

    def read(self, dom: "libvirt.virDomain") -> Snapshot:
        g = self.inv.get(dom.UUIDString())
        return snapshot.read(self.applier, dom, g.seq if g else 0)

    def observe(self, snap: Snapshot) -> Guest:
        """Refresh the cached guest from a snapshot (no changes to the guest)."""
        self.transient.track(snap)
        src = self.transient.source(snap)
        g = self.inv.upsert(snap.uuid, snap.name)
        g.persistent, g.nvcpus = snap.persistent, src.nvcpus
        g.policy, g.hint = src.policy, src.hint
        if src.metadata_error:
            g.status, g.error = "error", src.metadata_error
        self.inv.set_state(snap.uuid, snap.state, snap.seq)
        return g

    # --- one guest ---------------------------------------------------------------
    def sync(self, snap: Snapshot, trigger: str, received: float | None = None, confine: bool = False,
             drift: bool = False) -> tuple[Result | None, Snapshot]:
        """Refresh the cache from ``snap`` and verify/repair the guest. Errors are recorded, not raised.

        Decided again from a new read while the definition changes under the repair (another writer
        defined the guest after ``snap`` was read); returns the result and the snapshot last used.
        Whatever it changed in the allocations (a release, a new count, CPUs recovered from the guest's
        metadata) is saved before the lock is let go."""
        with self.lock:
            held = self.pools.pool, dict(self.pools.allocations)
            try:
                for _ in range(CHANGED_RETRIES):
                    try:
                        return self._sync_once(snap, trigger, received, confine, drift), snap
                    except DefinitionChanged as exc:
                        log.info("%s: %s; deciding again from the definition as it is now", trigger, exc)
                    try:
                        snap = self.read(snap.dom)
                    except libvirt.libvirtError as exc:
                        if not snapshot.gone(exc):
                            self._record_error(self.observe(snap), f"reading {snap.name!r} again failed: {exc}",
                                               "libvirt")
                        return None, snap
                self._record_error(self.observe(snap), f"the definition of {snap.name!r} changed under each of"
                                   f" {CHANGED_RETRIES} repairs; the next event or sweep tries again", "apply")
                return None, snap
            finally:
                if (self.pools.pool, self.pools.allocations) != held:
                    self.save()

    def _sync_once(self, snap: Snapshot, trigger: str, received: float | None, confine: bool,
                   drift: bool) -> Result | None:
        src = self.transient.source(snap)
        g = self.observe(snap)
        info = GuestInfo(snap.uuid, snap.name, src.nvcpus)
        error = src.metadata_error
        # without a policy in force, the safe fallback: keep the guest on the shared set, off every dedicated CPU
        desired = desired_for(None, info, self.pools, None, confine=True)
        if error is None:
            try:
                desired = self._desired(g, info, snap.active, confine, src)
            except PolicyError as exc:
                error = f"policy of {snap.name!r} cannot be enforced on this host: {exc}"
        try:
            result = self.verify(snap, g, desired)
        except DefinitionChanged:
            raise
        except (ApplyError, libvirt.libvirtError) as exc:
            if not (isinstance(exc, libvirt.libvirtError) and snapshot.gone(exc)):
                self._record_error(g, f"applying the policy of {snap.name!r} failed: {exc}", "apply")
            return None
        self.transient.mirror(snap, g, self._hint(self.pools.allocations.get(g.uuid)))
        self._sync_hint(snap, g)
        g.desired = desired
        g.warnings = [*g.warnings, *(w for w in result.deferred if w not in g.warnings)]
        if error:
            self._record_error(g, error, "validation")
        else:
            g.status, g.error = ("applied" if g.policy else "unmanaged"), None
        self._count(g, trigger, result, received, drift)
        return result

    def verify(self, snap: Snapshot, g: Guest, desired: Desired) -> Result:
        """Verify the guest against ``desired`` with the tuners' values in force (tuners/state.py): the
        persistent config gets the static policy, the live domain the static policy with the tuned overlay.
        Used by sync (events, sweeps, drift repair) and by the tuner to apply a change."""
        cfg_d, live_d = self.tuned.split(snap.uuid, desired, snap.run, g.policy, self.pools.shared)
        if live_d is desired:  # not tuned
            return self.applier.verify_and_repair(snap.dom, desired, snap.active, snap.persistent, snap.cfg, snap.live)
        # tuned: the live XML is read again here, under the enforcer's lock; a snapshot a sweep took before the
        # tuner's change would otherwise count that change as a repair
        if cfg_d is live_d:
            return self.applier.verify_and_repair(snap.dom, live_d, snap.active, snap.persistent, None, None)
        cfg = self.applier.verify_and_repair(snap.dom, cfg_d, False, snap.persistent, snap.cfg, None)
        live = self.applier.verify_and_repair(snap.dom, live_d, snap.active, False, None, None)
        return Result(cfg.config, live.live, live.deferred)

    def _desired(self, g: Guest, info: GuestInfo, active: bool, confine: bool, src: DomainXml) -> Desired:
        policy = g.policy
        if policy is None or policy.dedicated is None or (self.release_on_stop and not active):
            if self.pools.release(g.uuid) is not None:
                log.info("released the dedicated CPUs of %r", g.name)
            if policy is None:
                return self._unmanaged(g, info, confine, src)
            if policy.dedicated is not None:
                policy = policy.model_copy(update={"dedicated": None, "vcpu_pins": {}})  # stopped, released
            else:  # pins into the dedicated pool (written by another tool, or before a pool change) are refused
                if problems := pin_conflicts(policy, self.pools, None):
                    raise PolicyError(problems)
            return desired_for(policy, info, self.pools, None, confine=confine)
        if g.uuid not in self.pools.allocations:
            self._seed_from_hint(g, policy)
        checked = check_policy(policy, info, self.pools, {}, self.inv.resolve, self.inv.name_of)
        if checked.allocation != self.pools.allocations.get(g.uuid):
            log.info("guest %r now holds dedicated CPUs %s", g.name, cpuset.fmt(checked.allocation or ()))
            self.pools.assign(g.uuid, g.name, checked.allocation or frozenset())
        g.warnings = checked.warnings
        return checked.desired

    def _unmanaged(self, g: Guest, info: GuestInfo, confine: bool, src: DomainXml) -> Desired:
        """A guest without a policy: kept on the shared set, unless its manager pins it (its definition has
        its own placement the agent did not write): then it is left alone, and conflicts are reported."""
        desired = desired_for(None, info, self.pools, None, confine=confine)
        if desired.vcpus is None:
            return desired
        if manager_pinned(src, self.applier.host):
            if g.uuid not in self._foreign:
                self._foreign.add(g.uuid)
                log.info("guest %r has its own CPU pinning and no vmsched policy: left to its manager", g.name)
            return Desired(None, None, {})
        self._foreign.discard(g.uuid)
        return desired

    def _seed_from_hint(self, g: Guest, policy: GuestPolicy) -> None:
        """Recover an allocation the guest's metadata recorded for this host (checkpoint lost) for its ``policy``
        with dedicated CPUs."""
        h = g.hint
        if h is None or h.host != self.machine or not h.cpus <= self.pools.free:
            return
        trial = self.pools.copy()  # seeded only when the policy's request would keep exactly these CPUs
        trial.assign(g.uuid, g.name, h.cpus)
        with contextlib.suppress(PolicyError):
            if trial.request_for(g.uuid, g.name, policy, g.nvcpus) == h.cpus:
                log.info("recovered dedicated CPUs %s of %r from its metadata", cpuset.fmt(h.cpus), g.name)
                self.pools.assign(g.uuid, g.name, h.cpus)

    def _hint(self, held: CpuSet | None) -> metadata.AllocationHint | None:
        """What the guest's metadata records of the CPUs it holds (None: none)."""
        return metadata.AllocationHint(self.machine, held, self.pools.pool) if held else None

    def _sync_hint(self, snap: Snapshot, g: Guest) -> None:
        if g.policy is None:
            return
        hint = self._hint(self.pools.allocations.get(g.uuid))
        if hint == g.hint or (hint is None and g.hint is not None and g.hint.host != self.machine):
            return
        try:
            metadata.write(snap.dom, g.policy, hint)
            g.hint = hint
        except libvirt.libvirtError as exc:
            log.warning("could not record the allocation of %r in its metadata: %s", g.name, exc.get_error_message())

    def _record_error(self, g: Guest, message: str, kind: str) -> None:
        if g.error != message:
            log.error("%s", message)
            self.publish("error", {"guest": g.name, "uuid": g.uuid, "error": message})
        g.status, g.error = "error", message
        metrics.ERRORS.labels(kind).inc()

    def _count(self, g: Guest, trigger: str, result: Result, received: float | None, drift: bool) -> None:
        if result.changed:
            metrics.REPAIRS.labels(trigger).inc()
            changes = result.all()
            if drift and result.live:
                self._drift_times.setdefault(g.uuid, collections.deque(maxlen=DRIFT_LOOP[0])).append(time.monotonic())
                metrics.DRIFT.inc()
                log.warning("drift on %r restored: %s", g.name, ", ".join(changes))
                self.publish("drift", {"guest": g.name, "uuid": g.uuid, "fields": changes})
            else:
                log.info("%s: repaired %r: %s", trigger, g.name, ", ".join(changes))
        latency = None
        if received is not None:
            latency = time.monotonic() - received
            metrics.EVENT_TO_APPLIED.labels(trigger).observe(latency)
        if result.changed or received is not None:
            self.publish("applied", {"guest": g.name, "uuid": g.uuid, "trigger": trigger,
                                     "changes": result.all(), "latency": latency})

    def forget(self, uuid: str) -> None:
        """The guest is undefined: drop it and release what it held."""
        with self.lock:
            g = self.inv.remove(uuid)
            if self.pools.release(uuid) is not None:
                log.info("guest %s undefined: released its dedicated CPUs", g.name if g else uuid)
                self.save()

    def looping(self, uuid: str) -> bool:
        """Drift restored DRIFT_LOOP[0] times within DRIFT_LOOP[1] s: libvirt (or someone) keeps undoing
        it. Event-driven repairs pause (the sweep still applies once per interval) to avoid a write storm."""
        times = self._drift_times.get(uuid)
        return bool(times) and len(times) == times.maxlen and time.monotonic() - times[0] < DRIFT_LOOP[1]

    def process(self, conn: "libvirt.virConnect", uuid: str, trigger: str, received: float | None,
                drift: bool = False) -> None:
        if trigger == "tunable" and self.looping(uuid):
            g = self.inv.get(uuid)
            if g is not None and (g.error or "").find("repair loop") < 0:
                self._record_error(g, f"repair loop on {g.name!r}: its pins/tuning were undone"
                                      f" {DRIFT_LOOP[0]} times within {DRIFT_LOOP[1]:g} s; drift events are"
                                      " ignored for now, the periodic sweep keeps re-applying", "apply")
            return
        with self.lock:
            try:
                dom = conn.lookupByUUIDString(uuid)
                snap = self.read(dom)
            except libvirt.libvirtError as exc:
                if not snapshot.gone(exc):
                    raise
                self.forget(uuid)
            else:
                self.sync(snap, trigger, received, drift=drift)
                g = self.inv.get(snap.uuid)
                if g is not None:
                    self.overlaps.keep(g)
            self.update_gauges()

    # --- requests: set and delete ------------------------------------------------
    def set_policy(self, conn: "libvirt.virConnect", key: str, policy: GuestPolicy, problems: list[str]) -> dict:
        """Validate and apply ``policy``. ``problems`` are the request's own errors found while parsing it
        (``policy`` is then made of its valid fields): refused together with the host-fit problems."""
        with self.lock:
            dom = self.lookup(conn, key)
            snap = self.read(dom)
            src = self.transient.source(snap)
            info = GuestInfo(snap.uuid, snap.name, src.nvcpus)
            self.inv.upsert(snap.uuid, snap.name)  # known by name before its define event is handled: cycles close
            try:
                checked = check_policy(policy, info, self.pools, self.inv.graph(), self.inv.resolve, self.inv.name_of)
            except PolicyError as exc:
                problems += exc.errors
            if problems:
                metrics.APPLICATIONS.labels("refused").inc()
                raise PolicyError(problems)
            if self.release_on_stop and not snap.active and policy.dedicated is not None:
                # validated now; the CPUs are allocated when the guest starts
                checked.allocation = None
                stopped = policy.model_copy(update={"dedicated": None, "vcpu_pins": {}})
                checked.desired = desired_for(stopped, info, self.pools, None)
            self.tuned.drop(snap.uuid)  # a new static policy: the tuners start again from it
            hint = self._hint(checked.allocation)
            old_stored = self.transient.store.get(snap.uuid)
            try:
                if not snap.persistent:
                    self.transient.put(snap.uuid, snap.name, policy)  # on disk first: it must outlive the guest
                metadata.write(dom, policy, hint)
                result = self.applier.verify_and_repair(dom, checked.desired, snap.active, snap.persistent)
            except (ApplyError, libvirt.libvirtError) as exc:
                self._roll_back(snap, src)
                if not snap.persistent:
                    self.transient.restore(snap.uuid, old_stored)
                metrics.APPLICATIONS.labels("error").inc()
                raise ApplyError(f"applying the policy of {snap.name!r} failed, previous policy restored: {exc}") from exc
            if checked.allocation:
                self.pools.assign(snap.uuid, snap.name, checked.allocation)
            else:
                self.pools.release(snap.uuid)
            self.save()
            g = self.inv.upsert(snap.uuid, snap.name)
            g.policy, g.hint, g.nvcpus, g.desired = policy, hint, src.nvcpus, checked.desired
            g.status, g.error = "applied", None
            self.overlaps.forget(snap.uuid)
            g.warnings = [*checked.warnings, *result.deferred]
            metrics.APPLICATIONS.labels("ok").inc()
            self.update_gauges()
            log.info("policy of %r set%s", snap.name, f": {', '.join(result.all())}" if result.changed else "")
            self.publish("applied", {"guest": snap.name, "uuid": snap.uuid, "trigger": "set",
                                  "changes": result.all(), "latency": None})
            return self.view(g)

    def _roll_back(self, snap: Snapshot, src: DomainXml) -> None:
        try:
            if src.policy is not None:
                metadata.write(snap.dom, src.policy, src.hint)
            else:
                metadata.clear(snap.dom)
            g = self.inv.get(snap.uuid)
            if g is not None and g.desired is not None:
                self.applier.verify_and_repair(snap.dom, g.desired, snap.active, snap.persistent)
        except (ApplyError, libvirt.libvirtError) as exc:
            log.error("rolling back the policy of %r failed (the next sweep retries): %s", snap.name, exc)

    def delete_policy(self, conn: "libvirt.virConnect", key: str) -> dict:
        with self.lock:
            try:
                dom = self.lookup(conn, key)
            except GuestNotFound:
                stored = self.transient.store.find(key)
                if stored is None:
                    raise
                self.transient.remove(stored.uuid)
                log.info("stored policy of transient guest %r (%s, not running) deleted", stored.name, stored.uuid)
                return {"guest": stored.name, "uuid": stored.uuid, "deleted": True}
            snap = self.read(dom)
            src = self.transient.source(snap)
            old = src.policy
            if old is None and self.pools.allocations.get(snap.uuid) is None:
                return {"guest": snap.name, "uuid": snap.uuid, "deleted": False}
            self.transient.remove(snap.uuid)  # first: a failure below must not bring it back
            metadata.clear(dom)
            self.pools.release(snap.uuid)
            self.save()
            info = GuestInfo(snap.uuid, snap.name, src.nvcpus)
            base = desired_for(None, info, self.pools, None, confine=True)
            before = old.sched_params() if old is not None else {}
            defaults = {"cpu_shares": DEFAULT_SHARES, "vcpu_quota": -1}  # libvirt's: the default weight, no cap
            desired = Desired(base.vcpus, base.emulator, {k: v for k, v in defaults.items() if k in before})
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

    # --- all guests --------------------------------------------------------------
    def scan(self, conn: "libvirt.virConnect") -> list[Snapshot]:
        return snapshot.scan(conn, self.read)

    def sweep(self, conn: "libvirt.virConnect", trigger: str = "sweep", snaps: list[Snapshot] | None = None,
              confine: bool = False) -> dict:
        started = time.perf_counter()
        snaps = self.scan(conn) if snaps is None else snaps
        present = {s.uuid for s in snaps}
        with self.lock:
            for g in self.inv.all():
                if g.uuid not in present:
                    self.inv.remove(g.uuid)
            for uuid in [u for u in self.pools.allocations if u not in present]:
                log.info("releasing dedicated CPUs of %s: the guest no longer exists", self.pools.name(uuid))
                self.pools.release(uuid)
                self.save()

        def order(s: Snapshot) -> int:  # explicit sets, then current holders, then new requests
            p = self.transient.source(s).policy
            if p is not None and isinstance(p.dedicated, str):
                return 0
            return 1 if s.uuid in self.pools.allocations else 2

        repaired, errors, used = 0, [], []
        for snap in sorted(snaps, key=order):
            result, snap = self.sync(snap, trigger, None, confine)  # lock per guest: events interleave
            used.append(snap)
            g = self.inv.get(snap.uuid)
            if result is not None and result.changed:
                repaired += 1
            if g is not None and g.error:
                errors.append(g.error)
        with self.lock:
            errors += self.overlaps.report(used, self.inv, self.pools, self.applier.host, self._foreign)
        duration = time.perf_counter() - started
        metrics.RECONCILE_DURATION.observe(duration)
        self.update_gauges()
        return {"checked": len(snaps), "repaired": repaired, "errors": errors, "duration": duration}

    def update_gauges(self) -> None:
        metrics.GUESTS_MANAGED.set(self.inv.managed())
        metrics.DEDICATED_CPUS.labels("allocated").set(len(self.pools.allocated))
        metrics.DEDICATED_CPUS.labels("free").set(len(self.pools.free))

    def adopt_pools(self, new: Pools) -> None:
        with self.lock:
            self.pools.pool = new.pool
            self.pools.allocations = new.allocations
            self.pools.names = new.names
            self.save()
            self.update_gauges()

    def view(self, g: Guest) -> dict:
        view = self.inv.view(g, self.pools.allocations.get(g.uuid))
        left_out = self.applier.left_out(g.desired)
        if left_out is not None and view["status"] == "applied":  # e.g. weight and cap on the test driver
            view["status"], view["warnings"] = "partial", [*view["warnings"], left_out]
        return view
