"""Start and stop guests in dependency order, waiting for each one.

The order comes from :mod:`deps`; the guests' states from the event-fed
inventory; the actual start/stop calls from a :class:`Domains` (the libvirt
adapter provides one). No lock is held while waiting: the QEMU hook calls back
into the agent for every start.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from ..errors import ApplyError, PolicyError
from .inventory import Inventory, State

log = logging.getLogger(__name__)


class Domains(Protocol):
    """Lifecycle calls on the host's guests, by UUID; each raises ApplyError when refused."""

    def start(self, uuid: str, resume: bool) -> None: ...

    def shutdown(self, uuid: str) -> None: ...

    def destroy(self, uuid: str) -> None: ...


def start_in_order(inv: Inventory, domains: Domains, order: list[str], target: str, wait: float) -> dict:
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
        domains.start(key, resume=g.state == State.PAUSED)
        running = lambda: bool(inv.get(key) and inv.get(key).running)  # noqa: E731
        if not inv.wait_for(running, max(0.0, deadline - time.monotonic())):
            raise ApplyError(f"{g.name!r} was started but is not running after {wait:g} s")
        started.append(g.name)
    return {"started": started, "already_running": already}


def stop_in_order(inv: Inventory, domains: Domains, order: list[str], wait: float, force: bool) -> dict:
    stopped, already = [], []
    for key in order:
        g = inv.get(key)
        if g is None or not g.active:
            already.append(g.name if g else key)
            continue
        gone = lambda: not (inv.get(key) and inv.get(key).active)  # noqa: E731
        domains.shutdown(key)
        if not inv.wait_for(gone, wait):
            if not force:
                raise ApplyError(f"{g.name!r} did not shut down within {wait:g} s (retry with --force to destroy it)")
            log.warning("%r did not shut down within %g s: destroying it", g.name, wait)
            domains.destroy(key)
            if not inv.wait_for(gone, 30.0):
                raise ApplyError(f"{g.name!r} is still active after destroy")
        stopped.append(g.name)
    return {"stopped": stopped, "already_stopped": already}
