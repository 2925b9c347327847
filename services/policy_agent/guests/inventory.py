"""The agent's event-fed view of the guests on its host.

Updated from the libvirt event thread (states, at once) and from the worker
(policies, after reading the domain). ``check_start`` (asked by the QEMU hook
while libvirtd waits) is answered from here alone: never a libvirt call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable

from vmsched import cpuset

from ..policy.allocation import AllocationHint
from ..policy.model import GuestPolicy
from ..policy.validation import Desired


class State(IntEnum):
    """A guest's state: libvirt's ``virDomainState`` numbers (a stable ABI), without importing libvirt."""

    NOSTATE = 0
    RUNNING = 1
    BLOCKED = 2
    PAUSED = 3
    SHUTDOWN = 4
    SHUTOFF = 5
    CRASHED = 6
    PMSUSPENDED = 7


STATE_NAMES = {s: s.name.lower() for s in State}

# lifecycle event -> state it leaves the guest in
EVENT_STATES = {
    "started": State.RUNNING,
    "resumed": State.RUNNING,
    "suspended": State.PAUSED,
    "stopped": State.SHUTOFF,
    "shutdown": State.SHUTDOWN,
    "crashed": State.CRASHED,
    "pmsuspended": State.PMSUSPENDED,
}


@dataclass
class Guest:
    uuid: str
    name: str
    state: int = State.SHUTOFF
    persistent: bool = True
    nvcpus: int = 1
    policy: GuestPolicy | None = None
    hint: AllocationHint | None = None
    status: str = "unmanaged"  # applied | pending | error | unmanaged
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    desired: Desired | None = None
    seq: int = 0  # bumped by every state event: a slower reader must not overwrite a newer state

    @property
    def running(self) -> bool:
        return self.state in (State.RUNNING, State.BLOCKED)

    @property
    def active(self) -> bool:
        return self.state not in (State.SHUTOFF, State.NOSTATE)

    @property
    def state_name(self) -> str:
        return STATE_NAMES.get(self.state, str(self.state))


class Inventory:
    def __init__(self) -> None:
        self._guests: dict[str, Guest] = {}
        self._cond = threading.Condition()

    # --- reads -----------------------------------------------------------------
    def get(self, uuid: str) -> Guest | None:
        with self._cond:
            return self._guests.get(uuid)

    def all(self) -> list[Guest]:
        with self._cond:
            return list(self._guests.values())

    def resolve(self, key: str) -> str | None:
        """UUID of the guest named ``key`` (or whose UUID is ``key``)."""
        with self._cond:
            for k in (key, key.lower()):
                if k in self._guests:
                    return k
            return next((g.uuid for g in self._guests.values() if g.name == key), None)

    def name_of(self, key: str) -> str:
        g = self.get(key)
        return g.name if g else key

    def graph(self) -> dict[str, list[str]]:
        """uuid -> required guests (UUIDs, or raw names of guests not known here)."""
        return {g.uuid: [self.resolve(r) or r for r in g.policy.requires] if g.policy else [] for g in self.all()}

    def managed(self) -> int:
        return sum(1 for g in self.all() if g.policy is not None)

    # --- writes ----------------------------------------------------------------
    def upsert(self, uuid: str, name: str) -> Guest:
        with self._cond:
            g = self._guests.get(uuid)
            if g is None:
                g = self._guests[uuid] = Guest(uuid=uuid, name=name)
            g.name = name
            return g

    def on_event(self, uuid: str, name: str, event: str) -> None:
        """Apply a lifecycle event to the cached state (event-loop thread)."""
        with self._cond:
            g = self._guests.get(uuid)
            if event == "undefined":
                if g is not None and not g.active:
                    del self._guests[uuid]
                elif g is not None:
                    g.persistent = False
            else:
                g = self._guests.setdefault(uuid, Guest(uuid=uuid, name=name))
                if event == "defined":
                    g.persistent = True
                state = EVENT_STATES.get(event)
                if state is not None:
                    g.state = state
                    g.seq += 1
                    if event == "stopped" and not g.persistent:
                        del self._guests[uuid]  # a transient guest is gone when it stops
            self._cond.notify_all()

    def set_state(self, uuid: str, state: int, seq: int) -> None:
        """State read from libvirt by a worker that saw ``seq``: ignored if an event came since."""
        with self._cond:
            g = self._guests.get(uuid)
            if g is not None and g.seq == seq:
                g.state = state
                self._cond.notify_all()

    def remove(self, uuid: str) -> Guest | None:
        with self._cond:
            g = self._guests.pop(uuid, None)
            self._cond.notify_all()
            return g

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    # --- the hook's question -------------------------------------------------
    def check_start(self, key: str, policy: GuestPolicy | None = None) -> tuple[bool, str, list[str]]:
        """(allowed, message, missing requirement names) from cached state only."""
        uuid = self.resolve(key)
        guest = self.get(uuid) if uuid else None
        name = guest.name if guest else key
        if policy is None:
            policy = guest.policy if guest else None
        if policy is None or not policy.requires:
            return True, f"guest {name!r} has no start requirements", []
        missing = []
        details = []
        for req in policy.requires:
            ruuid = self.resolve(req)
            rg = self.get(ruuid) if ruuid else None
            if rg is None:
                missing.append(req)
                details.append(f"{req!r} (not defined on this host)")
            elif not rg.running:
                missing.append(rg.name)
                details.append(f"{rg.name!r} ({rg.state_name})")
        if missing:
            return False, f"guest {name!r} requires {', '.join(details)}: start it first (vmsched domain start {name} does this)", missing
        return True, f"requirements of {name!r} are running: {', '.join(policy.requires)}", []

    def view(self, g: Guest, allocation: frozenset[int] | None) -> dict:
        return {
            "guest": g.name,
            "uuid": g.uuid,
            "state": g.state_name,
            "policy": g.policy.to_dict() if g.policy is not None else None,
            "allocation": cpuset.fmt(allocation) if allocation else None,
            "desired": g.desired.view() if g.desired is not None else None,
            "status": g.status,
            "error": g.error,
            "warnings": list(g.warnings),
        }
