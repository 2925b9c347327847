"""Verify a guest against its desired state with the tuners' values in force (tuners/state.py):
the persistent config gets the static policy, the live domain the static policy with the tuned overlay.
Used by the enforcer's sync (events, sweeps, drift repair) and by the tuner to apply a change."""

from __future__ import annotations

import libvirt

from vmsched.cpuset import CpuSet

from ..guests.inventory import Guest
from ..policy.validation import Desired
from ..tuners.state import TunedState
from ..virt.apply import Applier, Result
from ..virt.snapshot import Snapshot


def run_of(snap: Snapshot) -> int | None:
    """The guest's run: its domain ID (cached in the domain object, no call to libvirtd), None when stopped."""
    if not snap.active:
        return None
    try:
        return int(snap.dom.ID())
    except libvirt.libvirtError:
        return None


def verify(applier: Applier, snap: Snapshot, g: Guest, desired: Desired, tuned: TunedState,
           shared: CpuSet) -> Result:
    cfg_d, live_d = tuned.split(snap.uuid, desired, run_of(snap), g.policy, shared)
    if live_d is desired:  # not tuned
        return applier.verify_and_repair(snap.dom, desired, snap.active, snap.persistent, snap.cfg, snap.live)
    # tuned: the live XML is read again here, under the enforcer's lock; a snapshot a sweep took before the
    # tuner's change would otherwise count that change as a repair
    if cfg_d is live_d:
        return applier.verify_and_repair(snap.dom, live_d, snap.active, snap.persistent, None, None)
    cfg = applier.verify_and_repair(snap.dom, cfg_d, False, snap.persistent, snap.cfg, None)
    live = applier.verify_and_repair(snap.dom, live_d, snap.active, False, None, None)
    return Result(cfg.config, live.live, live.deferred)
