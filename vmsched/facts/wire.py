"""Host facts on the worker pipe, proportional to change (docs/facts.md, "What a call carries").

A service's facts cache gives every stored host message a *generation*
number, unique in the process, and its plugin view as a JSON fragment made at
ingest (off the request path). A call's facts (:class:`PreparedFacts`) name, per
requested host, the message it has now. :class:`FactsWire` remembers which
generation of each host every worker process already holds, and writes into a
call frame only the hosts (and guest lists) that worker lacks; a worker
therefore always holds the current generation of every host of its call. The
call's set of hosts with facts is sent only when it differs from that
worker's previous call (``same_hosts`` otherwise): a steady-state call carries
no per-host data but the stale and the missing hosts.

The worker (:mod:`vmsched.facts.held`) keeps what it was sent and answers
``facts_resync`` when it lacks something the pool sent (each frame carries the
number of hosts sent since the last reset, ``count``); the pool then forgets
what that worker holds, so the next call sends it everything again (``reset``).
A new worker (started, restarted or recycled) is a new :class:`Worker` object
that holds nothing: its first call carries the full facts.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol


#: A worker that holds more hosts than this is told to drop them all (``reset``) and sent what it needs.
MAX_HELD = 20000

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class HostPart(Protocol):
    """One stored host message, as the cache gives it to a call (``vmsched.facts.cache.Entry``)."""

    gen: int  # generation of this message's host view
    guests_gen: int  # generation of its guest list (changes only when the list does)
    fragment: str  # JSON object text: the host's plugin view
    stale_at: float  # UNIX time from which this message is stale

    def guests_json(self) -> str:
        """JSON array text of the guest list (built on first use)."""
        ...


@dataclass
class PreparedFacts:
    """The facts of one request's plugin calls, shared by all its calls (each worker gets its own delta)."""

    now: float  # the service's time of the request: ages and staleness are counted from it
    refs: dict[str, HostPart]  # engine host ID -> its agent's stored message
    missing: dict[str, str]  # engine host ID -> why it has no facts
    vm: dict[str, Any] | None
    vm_problem: str | None
    with_guests: bool = False
    agents: dict[str, str] = field(default_factory=dict)  # engine host ID -> agent host ID, where they differ
    #: the cache's store count when ``refs`` were read (-1: not known). Two calls with the same epoch and hosts
    #: have the same refs: a worker sent one holds the other's (FactsWire.encode skips the per-host pass).
    epoch: int = -1
    _common: str = field(default="", repr=False)
    _hosts_key: str = field(default="", repr=False)

    def common(self) -> str:
        """JSON members every worker gets: time, stale hosts, missing hosts, the VM."""
        if not self._common:
            now = self.now
            stale = [h for h, part in self.refs.items() if part.stale_at < now]
            text = (f'"now":{_dumps(now)},"stale":{_dumps(stale)},"missing":{_dumps(self.missing)},'
                    f'"vm":{_dumps(self.vm)},"vm_problem":{_dumps(self.vm_problem)}')
            self._common = text + (',"with_guests":true' if self.with_guests else "")
        return self._common

    def hosts_key(self) -> str:
        """The call's hosts with facts, as one string (to compare with a worker's previous call)."""
        if not self._hosts_key:
            self._hosts_key = "\n".join(self.refs) or "\n"
        return self._hosts_key


class _Held:
    __slots__ = ("hosts", "guests", "sent", "last_hosts", "epoch", "__weakref__")

    def __init__(self) -> None:
        self.hosts: dict[str, int] = {}  # engine host ID -> generation the worker holds
        self.guests: dict[str, int] = {}  # engine host ID -> guest-list generation it holds
        self.sent = -1  # hosts and guest lists sent since the last reset; -1: the next frame resets
        self.last_hosts = ""  # hosts_key() of the worker's previous call
        self.epoch = -1  # PreparedFacts.epoch of that call: it holds that call's generations of last_hosts


class FactsWire:
    """Per worker, which facts it holds; the ``facts`` member of a call frame for one worker."""

    def __init__(self, max_held: int = MAX_HELD) -> None:
        self.max_held = max_held
        self._held: weakref.WeakKeyDictionary[Any, _Held] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def encode(self, worker: Any, facts: PreparedFacts) -> str:
        """JSON text of the call's facts for ``worker``: the hosts it lacks, and the call's hosts unless the same.

        Called by the one thread that has ``worker`` checked out, right before the frame is sent.
        """
        with self._lock:
            held = self._held.get(worker)
            if held is None:
                held = self._held[worker] = _Held()
        reset = held.sent < 0 or len(held.hosts) + len(facts.refs) > self.max_held
        if reset:
            held.hosts.clear()
            held.guests.clear()
            held.sent, held.last_hosts, held.epoch = 0, "", -1
        data: list[str] = []
        guests: list[str] = []
        key = facts.hosts_key()
        if facts.with_guests or facts.epoch < 0 or facts.epoch != held.epoch or key != held.last_hosts:
            hosts_held, guests_held = held.hosts, held.guests
            for host_id, part in facts.refs.items():
                if hosts_held.get(host_id) != part.gen:
                    agent_id = facts.agents.get(host_id, host_id)
                    data.append(f"{_dumps(host_id)}:[{part.gen},{_dumps(agent_id)},{part.fragment}]")
                    hosts_held[host_id] = part.gen
                if facts.with_guests and guests_held.get(host_id) != part.guests_gen:
                    guests.append(f"{_dumps(host_id)}:[{part.guests_gen},{part.guests_json()}]")
                    guests_held[host_id] = part.guests_gen
            held.epoch = facts.epoch
        # else: the worker's previous call had these hosts at this epoch, so it holds every one of them
        held.sent += len(data) + len(guests)
        text = "{" + facts.common() + f',"count":{held.sent}'
        if key == held.last_hosts:
            text += ',"same_hosts":true'
        else:
            text += ',"hosts":' + _dumps(list(facts.refs))
            held.last_hosts = key
        if data:
            text += ',"data":{' + ",".join(data) + "}"
        if guests:
            text += ',"guests":{' + ",".join(guests) + "}"
        return text + (',"reset":true}' if reset else "}")

    def forget(self, worker: Any) -> None:
        """``worker`` lost track (it answered ``facts_resync``): send it everything next time."""
        with self._lock:  # what it held goes with its record: the next encode() starts a new one, with a reset
            self._held.pop(worker, None)

    def held(self, worker: Any) -> int:
        """Hosts ``worker`` holds as far as the pool knows (tests, diagnostics)."""
        with self._lock:
            found = self._held.get(worker)
        return 0 if found is None else len(found.hosts)

