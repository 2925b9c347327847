"""The plugin worker's held host facts: what its pool sent it, kept across calls.

The pool (:mod:`vmsched.runtime.facts_wire`) sends a worker each host's facts
once per generation (a new message from its agent) and afterwards only the
call's stale and missing hosts. This module keeps what was
sent, builds a :class:`~vmsched.plugin.facts.Host` once per generation, and
installs a call's facts into :mod:`vmsched.plugin.facts` (docs/facts.md, "What
a call carries"). A held Host serves many calls: its ``age`` counts from the
current call's time, and ``stale`` is set when the service says so (a host
turns stale only with time, until its next message, which is a new Host).

The call's hosts with facts come as a list when they differ from the last
call's, else as ``same_hosts``; the Hosts built for them are kept with that
set, so a steady-state call costs the worker nothing per host until a unit
asks for one.

Consistency: the pool sends the number of hosts and guest lists it has sent
since the last reset (``count``); a worker whose own count differs (it failed
midway through a frame) reports the hosts it lacks as missing and answers
``facts_resync`` so the pool resends all. A host found lacking on first use in
a call (something in the worker changed what it holds) is reported the same
way.

Standard library only (the worker imports it).
"""

from __future__ import annotations

from typing import Any

from vmsched.plugin import facts
from vmsched.plugin.facts import Guest, Host, _build

LOST = "no facts: this plugin worker lost them (internal; the next call sends them again)"

_now = 0.0  # the service's time of the current call


class _Age:
    """``age`` of a held Host: seconds from its collection to the current call (unless set explicitly)."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return 0.0
        found = obj.__dict__
        if "_set_age" in found:  # dataclasses.replace() sets it
            return found["_set_age"]
        age = _now - found["time"]
        return round(age, 3) if age > 0 else 0.0

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["_set_age"] = value


class _HeldHost(Host):
    """A Host kept across calls; to a plugin it is a Host."""

    age = _Age()  # type: ignore[assignment]


_HeldHost.__name__ = _HeldHost.__qualname__ = "Host"


class Held:
    """The hosts (and guest lists) a worker holds, by engine host ID, and the host set of its last call."""

    def __init__(self) -> None:
        self.hosts: dict[str, list] = {}  # host ID -> [generation, agent host ID, view (None once built)]
        self.objs: dict[str, Host] = {}  # host ID -> its Host, built on first use of the generation
        self.guests: dict[str, list] = {}  # host ID -> [guest-list generation, list as sent, tuple of Guest]
        self.with_guests_objs: dict[str, Host] = {}  # host ID -> its Host with its guests (balance calls)
        self.count = 0  # hosts and guest lists received since the last reset
        self.call_hosts: dict[str, bool] | None = None  # the hosts with facts of the last call
        self.ready: dict[str, Host] = {}  # those of them built (filter and score calls)
        self.ready_with_guests: dict[str, Host] = {}  # the same for balance calls
        self.with_guests = False
        self.stale: set[str] | frozenset[str] = frozenset()
        self.lost = False  # this call named facts this worker lacks: the pool must send everything again

    def install(self, payload: dict[str, Any]) -> None:
        """Take a call's held-form facts (``lost`` is set when it names facts this worker lacks)."""
        global _now
        if payload.get("reset"):
            self.__init__()  # type: ignore[misc]
        data, guests = payload.get("data") or {}, payload.get("guests") or {}
        for host_id, (gen, agent_id, view) in data.items():
            self.hosts[host_id] = [gen, agent_id, view]
            for built in (self.objs, self.with_guests_objs, self.ready, self.ready_with_guests):
                built.pop(host_id, None)
        for host_id, (gen, listed) in guests.items():
            self.guests[host_id] = [gen, listed, None]
            self.with_guests_objs.pop(host_id, None)
            self.ready_with_guests.pop(host_id, None)
        self.count += len(data) + len(guests)  # after storing them: a failure midway shows as a wrong count
        _now = float(payload.get("now") or 0.0)
        self.with_guests = bool(payload.get("with_guests"))
        stale = payload.get("stale") or ()
        self.stale = set(stale) if stale else frozenset()
        if "hosts" in payload:  # another set of hosts than the last call's
            self.call_hosts = dict.fromkeys(payload["hosts"], True)
            self.ready, self.ready_with_guests = {}, {}
        call_hosts = self.call_hosts or {}
        ready = self.ready_with_guests if self.with_guests else self.ready
        self.lost = self.count != payload.get("count") or self.call_hosts is None
        if self.lost:
            gone = {h for h in call_hosts if h not in self.hosts or (self.with_guests and h not in self.guests)}
            call_hosts = {h: True for h in call_hosts if h not in gone}
            ready = {h: found for h, found in ready.items() if h in call_hosts}  # this call's only
            facts._missing.update(dict.fromkeys(gone, LOST))
        for host_id in stale:
            if host_id in ready:
                ready[host_id].__dict__["stale"] = True  # stale until its next message (a new Host)
        facts._raw_hosts, facts._hosts, facts._held_host = call_hosts, ready, self.host

    def host(self, host_id: str, _in_call: Any = True) -> Host | None:
        """The Host of a call's ``host_id`` (facts.host() asks on first use of its generation in a call)."""
        slot = self.hosts.get(host_id)
        if slot is None:  # only if something in the worker changed what it holds
            facts._missing[host_id] = LOST
            self.lost = True
            return None
        found = self.objs.get(host_id)
        if found is None:
            plain = _build(Host, {**slot[2], "host_id": host_id, "agent_host_id": slot[1]})
            found = self.objs[host_id] = object.__new__(_HeldHost)
            found.__dict__.update(plain.__dict__)
            del found.__dict__["age"]
            slot[2] = None  # the view is no longer needed
        if self.with_guests:
            found = self._with_guests(host_id, found)
        if host_id in self.stale:
            found.__dict__["stale"] = True
        facts._hosts[host_id] = found
        return found

    def _with_guests(self, host_id: str, plain: Host) -> Host:
        found = self.with_guests_objs.get(host_id)
        if found is None:
            listed = self.guests.get(host_id)
            if listed is not None and listed[2] is None:
                listed[2] = tuple(_build(Guest, g) for g in listed[1] if isinstance(g, dict))
                listed[1] = None
            found = self.with_guests_objs[host_id] = object.__new__(_HeldHost)
            found.__dict__.update(plain.__dict__, guests=listed[2] if listed is not None else ())
        return found


HELD = Held()


def install(payload: Any) -> None:
    """The worker's entry point before each unit: this call's facts, either form."""
    facts._install(payload)  # missing, vm, vm_problem; the hosts of the full form
    HELD.lost = False
    if isinstance(payload, dict) and "count" in payload:  # the held form (the pool's); else the full form
        HELD.install(payload)


def lost() -> bool:
    """After the unit ran: whether the call named facts this worker lacks (the reply asks for a resync)."""
    return HELD.lost
