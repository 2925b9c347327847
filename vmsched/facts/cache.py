"""The facts cache of a service replica: the newest facts of every host.

Fed with raw facts messages (:class:`vmsched.facts.subscription.FactsSubscriber`),
it keeps, per agent host ID, the newest message and the last guest list. A
message is dropped, with a log line and ``vmsched_facts_dropped_total{reason}``,
when it is oversized, malformed, of an unsupported version or out of order
(an older ``seq`` of the same agent instance, or an older collection from a
previous instance); nothing a message holds can break the cache.

Host identity (docs/facts.md): the engine sends its own host IDs. A host ID
resolves, in order, to an agent reporting that ``--host-id``, to the agent
named for it in the host map (``--facts-host-map``), then to the agent the
optional engine link found for it (``link``, :mod:`vmsched.engine_link`),
else to nothing: "no facts", with the reason, never a guess. A host is stale when its newest facts
are older than ``max_age`` (default: 3 of the agent's intervals).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client import Counter

from vmsched.facts.model import FactsMessage, GuestFacts, Rejected, facts_key, read
from vmsched.metrics import REGISTRY
from vmsched.plugin.facts import pack_floats
from vmsched.facts.wire import PreparedFacts

log = logging.getLogger("vmsched.facts")

RECEIVED = Counter("vmsched_facts_received_total", "Facts messages accepted into a facts cache", ["service"],
                   registry=REGISTRY)
DROPPED = Counter("vmsched_facts_dropped_total",
                  "Facts messages dropped, by reason (oversized, malformed, version, out_of_order, host_mismatch)",
                  ["service", "reason"], registry=REGISTRY)

#: Staleness when no --facts-max-age is set: this many of the agent's intervals.
STALE_INTERVALS = 3

#: Why hosts have no facts, as a decision says it of several hosts at once (:func:`cause`), from the reasons
#: :meth:`FactsCache.resolve` gives one host.
NO_AGENT = "no agent reports them"
SILENT_AGENT = "the agents they are mapped to have sent none"
NOT_LINKED = "no agent reports them, and the engine link does not map them to one"
NO_CACHE = "this service keeps no host facts (--facts is off)"
_NO_AGENT, _SILENT, _NOT_LINKED = "no agent reports host", "which has sent none", "it is not in --facts-host-map"


def cause(reason: str) -> str:
    """What a summary of several hosts says of one host's reason for having no facts (another reason as is)."""
    if reason.endswith(_SILENT):
        return SILENT_AGENT
    if _NO_AGENT in reason:
        return NOT_LINKED if _NOT_LINKED in reason else NO_AGENT
    return reason


@functools.lru_cache(maxsize=4096)
def _unknown_host(host_id: str) -> str:
    """Why a host no agent reports has no facts (made once per host: a call may name thousands)."""
    return (f"no facts: {_NO_AGENT} {host_id!r} (set the agent's --host-id to the engine's host ID, or map it in "
            "--facts-host-map)")


#: Generation numbers of stored host messages and guest lists, unique in the process (vmsched.facts.wire).
_GENERATIONS = itertools.count(1)
_compact = json.JSONEncoder(separators=(",", ":")).encode


#: Host summary fields a plugin does not get as such (the float lists travel packed, see Entry.fragment).
_NOT_IN_VIEW = {"allocations", "pcpu_pct", "cpu_history"}


@dataclass
class Entry:
    message: FactsMessage
    guests: list[GuestFacts] = field(default_factory=list)
    stale_at: float = 0.0  # UNIX time from which this message is stale
    guests_gen: int = 0  # generation of the guest list (kept while summaries without guests follow)
    gen: int = field(default_factory=lambda: next(_GENERATIONS))  # generation of this message
    time: float = 0.0  # UNIX time of the collection (message.time)
    _fragment: str = ""
    guests_text: str | None = field(default=None, repr=False)  # guests_json() once made (shared while the list stays)

    def __post_init__(self) -> None:
        self.guests_gen = self.guests_gen or self.gen
        self.time = self.message.time

    @property
    def fragment(self) -> str:
        """The plugin view as JSON (the pool sends it as is); made on first use, once per generation.

        Not at ingest: a process that never sends it to a plugin worker (the gateway; the balancer between
        balance calls) pays nothing for it, and the scoring service pays once per generation.
        """
        if not self._fragment:
            m = self.message
            head = m.host.model_dump_json(exclude=_NOT_IN_VIEW)  # pydantic's own encoder: the cheap way
            tail = _compact({"pcpu_text": pack_floats(m.host.pcpu_pct), "history_text": pack_floats(m.host.cpu_history),
                             "time": m.time, "interval": m.interval})
            self._fragment = f"{head[:-1]},{tail[1:]}" if head != "{}" else tail
        return self._fragment

    def guests_json(self) -> str:
        """The guest list as JSON (balance calls; made on first use, shared while the list stays)."""
        if self.guests_text is None:
            self.guests_text = _compact([g.model_dump() for g in self.guests])
        return self.guests_text


class Resolver(Protocol):
    """What the cache asks the engine link (:class:`vmsched.engine_link.EngineLink`); answers never block."""

    def host(self, engine_id: str) -> tuple[str | None, str]: ...

    def vm(self, vm_id: str) -> tuple[dict[str, Any] | None, str]: ...

    def mapped(self) -> dict[str, str]:
        """Engine host ID -> agent host ID, every mapping the link holds now."""
        ...

    def stop(self) -> None: ...


class FactsCache:
    def __init__(self, service: str = "service", max_age: float | None = None,
                 host_map: dict[str, str] | None = None, link: Resolver | None = None) -> None:
        self.service = service
        self.max_age = max_age
        self.host_map = dict(host_map or {})
        self.link = link
        self._hosts: dict[str, Entry] = {}
        self._vms: dict[str, tuple[str, GuestFacts]] = {}  # guest UUID -> (agent host ID, its facts)
        self._lock = threading.Lock()
        self._epoch = 0  # entries stored so far (PreparedFacts.epoch)
        _CACHES.add(self)
        RECEIVED.labels(service)  # every series at 0 from start-up (docs/deploy/monitoring.md)
        for reason in ("oversized", "malformed", "version", "out_of_order", "host_mismatch"):
            DROPPED.labels(service, reason)

    # --- ingest ------------------------------------------------------------------
    def ingest(self, raw: bytes, routing_key: str | None = None) -> bool:
        """Take one raw message; False (logged, counted) when dropped.

        ``routing_key``: the key it was published with; it must be the message's host's key.
        """
        try:
            message = read(raw)
            if routing_key is not None and routing_key != facts_key(message.host_id):
                raise Rejected("host_mismatch", f"facts of host {message.host_id!r} published with the key "
                                                f"{routing_key[:300]!r} (an agent may only speak for its own host)")
            self._store(message)
        except Rejected as exc:
            DROPPED.labels(self.service, exc.reason).inc()
            log.warning("%s: facts message dropped (%s): %s", self.service, exc.reason, exc)
            return False
        RECEIVED.labels(self.service).inc()
        return True

    def _store(self, message: FactsMessage) -> None:
        with self._lock:
            old = self._hosts.get(message.host_id)
            if old is not None:
                prev = old.message
                if prev.instance == message.instance and message.seq <= prev.seq:
                    raise Rejected("out_of_order", f"facts of {message.host_id!r} seq {message.seq} after seq {prev.seq}")
                if prev.instance != message.instance and message.time < prev.time:
                    raise Rejected("out_of_order", f"facts of {message.host_id!r} from an older agent instance")
            if message.guests is not None:
                guests = list(message.guests)
            elif old is not None and old.message.instance == message.instance:
                guests = old.guests
            else:
                guests = []  # a new instance's first summary without guests: the list follows
            if old is None or guests is not old.guests:
                for guest in old.guests if old is not None else ():
                    if self._vms.get(guest.uuid, ("",))[0] == message.host_id:
                        del self._vms[guest.uuid]
                for guest in guests:
                    self._vms[guest.uuid] = (message.host_id, guest)
            kept = old is not None and guests is old.guests
            limit = self.max_age if self.max_age is not None else STALE_INTERVALS * message.interval
            entry = Entry(message.model_copy(update={"guests": None}), guests, message.time + limit,
                          old.guests_gen if kept else 0,  # type: ignore[union-attr]
                          guests_text=old.guests_text if kept else None)  # type: ignore[union-attr]
            self._hosts[message.host_id] = entry
            self._epoch += 1

    # --- reading -----------------------------------------------------------------
    def resolve(self, host_id: str) -> tuple[Entry | None, str]:
        """The entry of an engine host ID and the agent host ID it resolved to, or (None, reason)."""
        entry = self._hosts.get(host_id)  # no lock: a stored entry is replaced whole, never edited
        if entry is not None:
            return entry, host_id
        with self._lock:
            mapped = self.host_map.get(host_id)
            if mapped is not None:
                entry = self._hosts.get(mapped)
                if entry is not None:
                    return entry, mapped
                return None, f"no facts: host {host_id!r} is mapped to agent {mapped!r}, {_SILENT}"
        if self.link is not None:
            agent, why = self.link.host(host_id)
            with self._lock:
                entry = self._hosts.get(agent) if agent is not None else None
            if entry is not None:
                return entry, agent  # type: ignore[return-value]
            return None, f"no facts: {_NO_AGENT} {host_id!r}, {_NOT_LINKED}, and {why}"
        return None, _unknown_host(host_id)

    def age(self, entry: Entry, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - entry.time)

    def is_stale(self, entry: Entry, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > entry.stale_at

    def ages(self, hosts: Iterable[str], now: float | None = None) -> dict[str, float]:
        """Seconds since each host's facts were collected (3 decimals), by engine host ID; hosts without facts
        are left out (the decision log's ``facts_age``). One pass, no lock for hosts whose agent reports the
        engine's ID (the common case)."""
        now = time.time() if now is None else now
        return {h: round(self.age(e, now), 3) for h in hosts if (e := self.resolve(h)[0]) is not None}

    def hosts(self) -> list[str]:
        with self._lock:
            return sorted(self._hosts)

    def prepared(self, hosts: list[str], vm: str = "", with_guests: bool = False) -> PreparedFacts:
        """The facts of one request's plugin calls, for the pool to send each worker what it lacks.

        By reference: each host's stored message with its generation (:mod:`vmsched.facts.wire`).
        """
        with self._lock:  # an agent reporting the engine's ID: the common case, one lock for all
            get = self._hosts.get
            refs: dict[str, Entry] = {h: e for h in hosts if (e := get(h)) is not None}
            epoch = self._epoch  # read with refs: the same epoch means the same entries
        agents: dict[str, str] = {}
        missing: dict[str, str] = {}
        if len(refs) < len(hosts) and not self.host_map and self.link is None:  # nothing to resolve them by
            missing = {h: _unknown_host(h) for h in hosts if h not in refs}
        elif len(refs) < len(hosts):
            for host_id in dict.fromkeys(hosts):
                if host_id in refs:
                    continue
                entry, resolved = self.resolve(host_id)
                if entry is None:
                    missing[host_id] = resolved
                else:
                    refs[host_id], agents[host_id] = entry, resolved
        vm_view, problem = self.vm(vm)
        # a host resolved through the map or the link: what it resolves to may change without a store
        return PreparedFacts(time.time(), refs, missing, vm_view, problem, with_guests, agents,  # type: ignore[arg-type]
                         epoch=-1 if agents else epoch)

    def vm(self, vm: str) -> tuple[dict | None, str | None]:
        """A call's VM as plugins read it (``vmsched.plugin.facts.vm``), or (None, why it is not known)."""
        if not vm:
            return None, "the call has no VM"
        with self._lock:
            found = self._vms.get(vm)
        if found is not None:
            host_id, guest = found
            return {"id": vm, "memory_mib": guest.memory_mib, "vcpus": guest.vcpus,
                    "host_id": host_id, "source": "host facts"}, None
        if self.link is not None:
            view, problem = self.link.vm(vm)
            return (view, None) if view is not None else (None, f"VM {vm!r} runs on no host with facts; {problem}")
        return None, (f"VM {vm!r} runs on no host with facts, and no engine link is configured to ask the "
                      "engine for its memory and vCPUs")

    def engine_ids(self) -> dict[str, list[dict[str, str]]]:
        """Agent host ID -> the engine host IDs that resolve to it, each with how (``via``), for the JSON API.

        ``agent``: the agent's own host ID (the engine's when the agent runs with ``--host-id`` set to it);
        ``host map``: a line of ``--facts-host-map``; ``engine link``: what the engine link found. An engine ID
        shadowed by an earlier step of :meth:`resolve` (an agent reporting it, a host-map line) is left out.
        """
        with self._lock:
            agents = list(self._hosts)
        link = self.link.mapped() if self.link is not None else {}
        out: dict[str, list[dict[str, str]]] = {a: [{"id": a, "via": "agent"}] for a in agents}
        for via, mapping in (("host map", self.host_map), ("engine link", link)):
            for engine_id, agent in mapping.items():
                if agent in out and engine_id not in out and (via == "host map" or engine_id not in self.host_map):
                    out[agent].append({"id": engine_id, "via": via})
        return out

    def view(self, host_id: str, now: float | None = None,
             engine_ids: dict[str, list[dict[str, str]]] | None = None) -> dict[str, Any] | None:
        """The JSON API's view of one host, or None (``engine_ids``: :meth:`engine_ids`, when already made)."""
        entry, resolved = self.resolve(host_id)
        if entry is None:
            return None
        engine_ids = self.engine_ids() if engine_ids is None else engine_ids
        now = time.time() if now is None else now
        m = entry.message
        how = "" if resolved == host_id else "; host map" if host_id in self.host_map else "; mapped by the engine link"
        return {"host_id": host_id, "agent_host_id": resolved, "stale": self.is_stale(entry, now),
                "age": round(self.age(entry, now), 3), "source": f"agent {resolved} (instance {m.instance}){how}",
                "engine_host_ids": engine_ids.get(resolved, []),
                "time": m.time, "seq": m.seq, "interval": m.interval, "version": m.v,
                "host": m.host.model_dump(), "guests": [g.model_dump() for g in entry.guests]}

    def views(self) -> list[dict[str, Any]]:
        now = time.time()
        ids = self.engine_ids()
        return [v for v in (self.view(h, now, ids) for h in self.hosts()) if v is not None]

    def identities(self) -> dict[str, tuple[str, str]]:
        """Agent host ID -> (vdsm ID, libvirt host UUID), what the engine link searches the engine by."""
        with self._lock:
            return {h: (e.message.host.vdsm_id, e.message.host.libvirt_uuid) for h, e in self._hosts.items()}

    def problem(self, host_id: str) -> str:
        return self.resolve(host_id)[1]

    def freshness(self) -> Iterator[tuple[str, float, bool]]:
        """Each host's ID, age in seconds and whether it is stale (the metrics)."""
        now = time.time()
        with self._lock:
            entries = list(self._hosts.items())
        for host_id, entry in entries:
            yield host_id, self.age(entry, now), self.is_stale(entry, now)


# --- metrics computed at scrape time -------------------------------------------------

_CACHES: "weakref.WeakSet[FactsCache]" = weakref.WeakSet()


class _Collector:
    """The families of every cache, at scrape time (registered, the registry collects them once to learn their
    names)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        age = GaugeMetricFamily("vmsched_facts_age_seconds", "Age of the newest facts of each host, by service "
                                "(the one metric labelled with a host ID: one series per hypervisor)",
                                labels=["service", "host"])
        known = GaugeMetricFamily("vmsched_facts_hosts", "Hosts in a facts cache", labels=["service"])
        stale = GaugeMetricFamily("vmsched_facts_hosts_stale", "Hosts whose facts are stale", labels=["service"])
        for cache in list(_CACHES):
            n = n_stale = 0
            for host_id, seconds, is_stale in cache.freshness():
                age.add_metric([cache.service, host_id], seconds)
                n += 1
                n_stale += is_stale
            known.add_metric([cache.service], n)
            stale.add_metric([cache.service], n_stale)
        yield age
        yield known
        yield stale


REGISTRY.register(_Collector())  # type: ignore[arg-type]
