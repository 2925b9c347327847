"""Policies of transient guests: what the enforcer does with the agent's policy store.

A transient guest (``createXML``, as oVirt's vdsm creates guests) has no
persistent definition, so its metadata dies with it. Its policy lives in the
agent's :class:`~..state.store.PolicyStore` by UUID: written by ``set``,
removed by ``delete``, and, when a guest with that UUID starts again without
a policy in its live metadata, used as its policy and written back into that
metadata. Persistent guests never use the store.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import libvirt

from .. import metrics
from ..errors import ApplyError
from ..guests.inventory import Guest, Inventory
from ..policy.allocation import AllocationHint
from ..policy.model import GuestPolicy
from ..state.store import PolicyStore, Stored
from ..virt import metadata
from ..virt.domxml import DomainXml
from ..virt.snapshot import Snapshot

log = logging.getLogger(__name__)


class TransientPolicies:
    def __init__(self, store: PolicyStore):
        self.store = store

    def source(self, snap: Snapshot) -> DomainXml:
        """The guest's definition; a transient one without a policy in its live metadata gets the stored one."""
        src = snap.xml
        if snap.persistent or src.policy is not None or src.metadata_error:
            return src
        stored = self.store.get(snap.uuid)
        return src if stored is None else dataclasses.replace(src, policy=stored.policy, hint=None)

    def track(self, snap: Snapshot) -> None:
        """Keep the store in step with the guest's own metadata.

        A transient guest whose live metadata holds a policy (written by another tool) has it
        stored, so that it outlives the guest; a guest that became
        persistent with its policy in its definition no longer needs the stored copy.
        """
        if snap.xml.metadata_error:
            return
        policy, stored = snap.xml.policy, self.store.get(snap.uuid)
        try:
            if not snap.persistent and policy is not None and (stored is None or stored.policy != policy
                                                               or stored.name != snap.name):
                self.store.put(snap.uuid, snap.name, policy)
                log.info("stored the policy of transient guest %r (%s)", snap.name, snap.uuid)
            elif snap.persistent and stored is not None and policy is not None:
                self.store.remove(snap.uuid)
                log.info("guest %r is persistent now: its definition holds its policy; stored copy dropped",
                         snap.name)
        except OSError as exc:
            metrics.ERRORS.labels("store").inc()
            log.error("cannot write the transient policy store %s: %s", self.store.path, exc)

    def mirror(self, snap: Snapshot, g: Guest, hint: AllocationHint | None) -> None:
        """A transient guest runs with its policy only in the store: write it into its live metadata
        (what `virsh dumpxml`, the QEMU hook and other tools see)."""
        if snap.persistent or not snap.active or snap.xml.policy is not None or g.policy is None:
            return
        try:
            metadata.write(snap.dom, g.policy, hint)
            g.hint = hint
            log.info("transient guest %r: stored policy applied and written into its live metadata", snap.name)
        except libvirt.libvirtError as exc:
            log.warning("could not write the stored policy of %r into its live metadata: %s", g.name,
                        exc.get_error_message())

    # --- requests: errors become ApplyError --------------------------------------
    def put(self, uuid: str, name: str, policy: GuestPolicy) -> None:
        self._write(self.store.put, uuid, name, policy)

    def remove(self, uuid: str) -> None:
        self._write(self.store.remove, uuid)

    def restore(self, uuid: str, old: Stored | None) -> None:
        """Undo a ``put`` (rollback of a failed set); logs instead of raising."""
        try:
            if old is None:
                self.store.remove(uuid)
            else:
                self.store.put(uuid, old.name, old.policy)
        except OSError as exc:
            log.error("restoring the transient policy store %s failed: %s", self.store.path, exc)

    def _write(self, change: Callable[..., object], *args: Any) -> None:
        try:
            change(*args)
        except OSError as exc:
            metrics.ERRORS.labels("store").inc()
            raise ApplyError(f"cannot write the transient policy store {self.store.path}: {exc}") from exc

    def absent_views(self, inv: Inventory) -> list[dict]:
        """Stored policies of transient guests that do not exist right now (for listing)."""
        note = ["transient guest not running: its stored policy is applied when it starts"]
        return [{**inv.view(Guest(e.uuid, e.name, policy=e.policy, status="pending", warnings=note), None),
                 "state": "absent"} for e in self.store.all() if inv.get(e.uuid) is None]
