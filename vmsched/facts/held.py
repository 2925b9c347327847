"""The plugin worker's held host facts: what its pool sent it, kept across calls.

The pool (:mod:`vmsched.facts.wire`) sends a worker each host's facts
once per generation (a new message from its agent) and afterwards only the
call's stale and missing hosts. :class:`HeldFacts` keeps what was sent, builds
a :class:`~vmsched.plugin.facts.Host` once per generation, and makes each
call's :class:`~vmsched.plugin.facts.CallFacts`, which the worker sets in
``vmsched.plugin.facts.CALL`` while the unit runs (docs/facts.md, "What a call
carries"). A held Host serves many calls: its ``age``
counts from the reading call's time; when
the service says it is stale it is made again, stale (a host turns stale only
with time, until its next message, which is a new Host).

The call's hosts with facts come as a list when they differ from the last
call's, else as ``same_hosts``; the Hosts made for them are kept with that
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

from dataclasses import replace
from typing import Any

from vmsched.plugin.facts import CallFacts, Guest, Host, build

LOST = "no facts: this plugin worker lost them (internal; the next call sends them again)"


class HeldFacts:
    """The hosts (and guest lists) a worker holds, by engine host ID, and the host set of its last call."""

    def __init__(self) -> None:
        self.drop()

    def drop(self) -> None:
        """Hold nothing (a frame that says ``reset``)."""
        self.hosts: dict[str, list] = {}  # host ID -> [generation, agent host ID, view (None once built)]
        self.objs: dict[str, Host] = {}  # host ID -> its Host, built on first use of the generation
        self.guests: dict[str, list] = {}  # host ID -> [guest-list generation, list as sent, tuple of Guest]
        self.with_guests_objs: dict[str, Host] = {}  # host ID -> its Host with its guests (balance calls)
        self.count = 0  # hosts and guest lists received since the last reset
        self.call_hosts: dict[str, bool] | None = None  # the hosts with facts of the last call
        self.ready: dict[str, Host] = {}  # those of them made (filter and score calls)
        self.ready_with_guests: dict[str, Host] = {}  # the same for balance calls
        self.with_guests = False  # the current call's
        self.stale: set[str] | frozenset[str] = frozenset()  # the current call's
        self.lost = False  # the current call named facts this worker lacks: the pool must send everything again

    def for_call(self, payload: Any) -> CallFacts:
        """The facts of a call as the pool sent them, in either form (``lost`` says whether it named facts this
        worker lacks)."""
        self.lost = False
        if not (isinstance(payload, dict) and "count" in payload):  # the full form (or none)
            return CallFacts(payload)
        if payload.get("reset"):
            self.drop()
        data, guests = payload.get("data") or {}, payload.get("guests") or {}
        for host_id, (gen, agent_id, view) in data.items():
            self.hosts[host_id] = [gen, agent_id, view]
            for made in (self.objs, self.with_guests_objs, self.ready, self.ready_with_guests):
                made.pop(host_id, None)
        for host_id, (gen, listed) in guests.items():
            self.guests[host_id] = [gen, listed, None]
            self.with_guests_objs.pop(host_id, None)
            self.ready_with_guests.pop(host_id, None)
        self.count += len(data) + len(guests)  # after storing them: a failure midway shows as a wrong count
        self.with_guests = bool(payload.get("with_guests"))
        stale = payload.get("stale") or ()
        self.stale = set(stale) if stale else frozenset()
        if "hosts" in payload:  # another set of hosts than the last call's
            self.call_hosts = dict.fromkeys(payload["hosts"], True)
            self.ready, self.ready_with_guests = {}, {}
        call_hosts = self.call_hosts or {}
        ready = self.ready_with_guests if self.with_guests else self.ready
        self.lost = self.count != payload.get("count") or self.call_hosts is None
        gone: set[str] = set()
        if self.lost:
            gone = {h for h in call_hosts if h not in self.hosts or (self.with_guests and h not in self.guests)}
            call_hosts = {h: True for h in call_hosts if h not in gone}
            ready = {h: found for h, found in ready.items() if h in call_hosts}  # this call's only
        for host_id in stale:
            found = ready.get(host_id)
            if found is not None and not found.stale:
                del ready[host_id]  # made again, stale, on first use
        call = CallFacts(payload, hosts=call_hosts, found=ready, now=float(payload.get("now") or 0.0),
                         lookup=lambda host_id: self.host(host_id, call))
        call.missing.update(dict.fromkeys(gone, LOST))
        return call

    def host(self, host_id: str, call: CallFacts) -> Host | None:
        """The Host of one of ``call``'s hosts (asked on first use of its generation in a call)."""
        slot = self.hosts.get(host_id)
        if slot is None:  # only if something in the worker changed what it holds
            call.missing[host_id] = LOST
            self.lost = True
            return None
        found = self.objs.get(host_id)
        if found is None:
            found = self.objs[host_id] = build(Host, {**slot[2], "host_id": host_id, "agent_host_id": slot[1]})
            slot[2] = None  # the view is no longer needed
        if host_id in self.stale and not found.stale:  # stale until its next message (a new Host)
            found = self.objs[host_id] = replace(found, stale=True)
        return self._with_guests(host_id, found) if self.with_guests else found

    def _with_guests(self, host_id: str, plain: Host) -> Host:
        found = self.with_guests_objs.get(host_id)
        if found is None or found.stale != plain.stale:
            listed = self.guests.get(host_id)
            if listed is not None and listed[2] is None:
                listed[2] = tuple(build(Guest, g) for g in listed[1] if isinstance(g, dict))
                listed[1] = None
            guests = listed[2] if listed is not None else ()
            found = self.with_guests_objs[host_id] = replace(plain, guests=guests)
        return found
