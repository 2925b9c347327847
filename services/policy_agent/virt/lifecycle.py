"""Start and stop guests in dependency order, waiting for each one: the libvirt side of orchestration.

The order comes from :mod:`deps`; the guests' states from the event-fed
inventory; the start, resume, shutdown and destroy calls go to libvirt. No
lock is held while waiting: the QEMU hook calls back into the agent for every
start.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import libvirt

from ..errors import ApplyError, PolicyError
from ..guests.inventory import Inventory, State

log = logging.getLogger(__name__)

Conn = Callable[[], "libvirt.virConnect"]


def _call(conn: Conn, inv: Inventory, uuid: str, what: str, fn: Callable[["libvirt.virDomain"], object]) -> None:
    try:
        fn(conn().lookupByUUIDString(uuid))
    except libvirt.libvirtError as exc:
        raise ApplyError(f"{what} {inv.name_of(uuid)!r} failed: {exc.get_error_message()}") from exc


def start_in_order(inv: Inventory, conn: Conn, order: list[str], target: str, wait: float) -> dict:
    started, already = [], []
    deadline = time.monotonic() + wait
    for key in order:
        g = inv.get(key)
        if g is None:
            raise PolicyError(f"cannot start {inv.name_of(target)!r}: required guest {key!r}"
                              " is not defined on this host")
        if g.running:
            already.append(g.name)
            continue
        start = libvirt.virDomain.resume if g.state == State.PAUSED else libvirt.virDomain.create
        _call(conn, inv, key, "starting", start)
        running = lambda: bool(inv.get(key) and inv.get(key).running)  # noqa: E731
        if not inv.wait_for(running, max(0.0, deadline - time.monotonic())):
            raise ApplyError(f"{g.name!r} was started but is not running after {wait:g} s")
        started.append(g.name)
    return {"started": started, "already_running": already}


def stop_in_order(inv: Inventory, conn: Conn, order: list[str], wait: float, force: bool) -> dict:
    stopped, already = [], []
    for key in order:
        g = inv.get(key)
        if g is None or not g.active:
            already.append(g.name if g else key)
            continue
        gone = lambda: not (inv.get(key) and inv.get(key).active)  # noqa: E731
        _call(conn, inv, key, "stopping", libvirt.virDomain.shutdown)
        if not inv.wait_for(gone, wait):
            if not force:
                raise ApplyError(f"{g.name!r} did not shut down within {wait:g} s (retry with --force to destroy it)")
            log.warning("%r did not shut down within %g s: destroying it", g.name, wait)
            _call(conn, inv, key, "stopping", libvirt.virDomain.destroy)
            if not inv.wait_for(gone, 30.0):
                raise ApplyError(f"{g.name!r} is still active after destroy")
        stopped.append(g.name)
    return {"stopped": stopped, "already_stopped": already}
