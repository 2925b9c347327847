"""Host facts for plugin units: ``from vmsched.plugin import facts``.

The service attaches the facts of a call's hosts (and of its VM, when known)
to every plugin call; the worker installs them here before the unit runs, so
reading them does no I/O::

    from vmsched.plugin import facts

    class FewestGuests:
        def do_score(self, hosts, vm, args):
            return [(h, facts.host(h).guests_running if facts.host(h) else 0) for h in hosts]

- :func:`host` (``host_id``) -> :class:`Host` or ``None`` (no agent, stale
  data is still returned with ``stale=True``; :func:`missing` says why a host
  has none);
- :func:`hosts` -> every host of the call that has facts;
- :func:`vm` -> :class:`VM` or ``None`` (:func:`vm_problem` says why);
- :class:`FactsMissing`: raise it when the facts a unit needs are missing, so
  that its call fails with the message alone (an expected failure: no
  traceback in the service's log).

Units: memory in MiB, CPU in % (a host's 100 % is all its CPUs; a guest's is
all its vCPUs), times in seconds. Standard library only (the worker imports it).

The facts of the call a unit runs in are one :class:`CallFacts`, which the plugin
worker sets in :data:`CALL` around each call; the functions above read it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from itertools import takewhile
from typing import Any

@dataclass(frozen=True)
class Guest:
    """A guest on a host (balance calls only, and the call's VM)."""

    uuid: str  # libvirt UUID = the engine's VM id
    name: str = ""
    state: str = ""  # running, paused, shutoff, ...
    vcpus: int = 0
    memory_mib: int = 0  # current balloon, MiB
    max_memory_mib: int = 0  # maximum balloon, MiB
    cpu_pct: float = 0.0  # CPU time over the agent's last interval, % of the guest's vCPUs
    has_policy: bool = False  # a vmsched CPU policy is set
    dedicated: bool = False  # the guest has dedicated pCPUs
    dedicated_cpus: int = 0  # dedicated pCPUs it holds
    pinned: bool = False  # its vmsched policy pins vCPUs or the emulator to given pCPUs


@dataclass(frozen=True)
class Host:
    """One hypervisor as its agent last measured it."""

    host_id: str  # the ID the engine sent
    agent_host_id: str = ""  # the agent's --host-id (same unless mapped)
    stale: bool = False  # newer facts are overdue (older than the service's --facts-max-age)
    time: float = 0.0  # UNIX time of the collection
    fixed_age: float | None = field(default=None, repr=False)  # an age given as such (a facts file), else see age
    interval: float = 0.0  # the agent's collection interval, seconds
    hostname: str = ""
    libvirt_uuid: str = ""
    vdsm_id: str = ""
    sockets: int = 0
    cores: int = 0  # per socket
    threads: int = 0  # per core
    cpus: int = 0  # online CPUs
    cpu_pct: float = 0.0  # host CPU use (user + system) over the last interval, % of all CPUs
    pcpu_text: str = field(default="", repr=False)  # pcpu_pct as sent: "12.5,3,..." (parsed on first use)
    load_avg: tuple[float, ...] = ()  # 1, 5, 15 minutes
    memory_total_mib: int = 0
    memory_free_mib: int = 0  # MemFree + Cached + Buffers + SReclaimable, MiB (oVirt's free memory)
    memory_available_mib: int = 0  # MemAvailable, MiB
    swap_total_mib: int = 0
    swap_used_mib: int = 0
    dedicated_pool: str = ""  # CPU set
    shared_cpus: str = ""  # CPU set
    dedicated_pool_cpus: int | None = None  # CPUs in the dedicated pool (None: not known)
    dedicated_free_cpus: int | None = None  # CPUs of the pool no guest holds (None: not known)
    dedicated_nodes: tuple[dict, ...] = ()  # per NUMA node of the pool: {"node", "free_cpus", "free_cores",
    # "free_core_cpus"} (free whole cores and their CPUs)
    dedicated_guests: dict = field(default_factory=dict)  # guest UUID -> {"wanted", "held" dedicated CPUs,
    # "thread_policy", "numa", "emulator"}, for every guest whose vmsched policy this host's agent knows (running,
    # defined, or stored for a transient guest)
    guests_running: int = 0
    guests_total: int = 0
    guest_memory_mib: int = 0  # sum of running guests' current balloon, MiB
    guest_vcpus: int = 0  # sum of running guests' vCPUs
    history_interval: float = 0.0  # seconds between cpu_history samples
    history_text: str = field(default="", repr=False)  # cpu_history as sent (parsed on first use)
    numa: tuple[dict, ...] = ()  # {"id", "cpus" (CPU set), "memory_mib"}
    hugepages: tuple[dict, ...] = ()  # {"size_kib", "total", "free"} (pages)
    guests: tuple[Guest, ...] = field(default=())  # balance calls only

    @property
    def age(self) -> float:
        """Seconds since the agent collected these facts, at the time of the call reading them."""
        if self.fixed_age is not None:
            return self.fixed_age
        age = CALL.get().now - self.time
        return round(age, 3) if age > 0 else 0.0

    @functools.cached_property
    def pcpu_pct(self) -> tuple[float, ...]:
        """Utilisation of each online pCPU over the last interval, %."""
        return _floats(self.pcpu_text)

    @functools.cached_property
    def cpu_history(self) -> tuple[float, ...]:
        """Host cpu_pct samples at history_interval, oldest first (about 10 minutes)."""
        return _floats(self.history_text)

    def cpu_avg(self, seconds: float | None = None) -> float:
        """Mean host CPU % over the last ``seconds`` of history (all of it by default)."""
        samples = _window(self.cpu_history, self.history_interval, seconds)
        return sum(samples) / len(samples) if samples else self.cpu_pct

    def cpu_stdev(self, seconds: float | None = None) -> float:
        """Population standard deviation of host CPU % over the window, %."""
        samples = _window(self.cpu_history, self.history_interval, seconds)
        if len(samples) < 2:
            return 0.0
        mean = sum(samples) / len(samples)
        return math.sqrt(sum((s - mean) ** 2 for s in samples) / len(samples))

    def cpu_above_for(self, threshold: float) -> float:
        """Seconds host CPU has been continuously above ``threshold`` % (at most the history's length)."""
        return run_length(self.cpu_history, self.history_interval, lambda s: s > threshold)

    def cpu_below_for(self, threshold: float) -> float:
        """Seconds host CPU has been continuously below ``threshold`` %."""
        return run_length(self.cpu_history, self.history_interval, lambda s: s < threshold)


@dataclass(frozen=True)
class VM:
    """The call's VM: what it needs."""

    id: str
    memory_mib: int = 0  # current balloon, MiB
    vcpus: int = 0
    host_id: str = ""  # the host it runs on, when running
    source: str = ""  # "host facts" (a running VM) or "engine" (the engine link)
    cpu_pinning_policy: str = ""  # the engine's (none, manual, dedicated, isolate_threads, ...); "": unknown
    dedicated_cpus: int | None = None  # what cpu_pinning_policy asks of a dedicated pool (the engine link); None: unknown
    thread_policy: str = ""  # ... and how: prefer, require or isolate ("": unknown)
    numa: str = ""  # any or strict ("": unknown)
    pending: dict = field(default_factory=dict)  # host ID -> MiB of each other VM placed there moments ago (pending())


#: oVirt's CPU pinning policies (a VM's ``cpu_pinning_policy``) in the agent's words: dedicated CPUs per vCPU, the
#: thread policy and the NUMA policy. ``resize_and_pin_numa`` takes no CPUs of a pool (oVirt pins the VM to the
#: host's NUMA nodes itself); none and manual ask nothing of a pool.
PINNING_POLICIES = {"dedicated": (1, "prefer", "any"), "isolate_threads": (1, "isolate", "any"),
                    "resize_and_pin_numa": (0, "prefer", "strict")}


def pinning_needs(policy: str, vcpus: int) -> dict[str, Any]:
    """What a VM of the engine's CPU pinning ``policy`` asks of a host's dedicated pool: ``dedicated_cpus``,
    ``thread_policy``, ``numa``."""
    per_vcpu, threads, numa = PINNING_POLICIES.get(policy, (0, "prefer", "any"))
    return {"dedicated_cpus": per_vcpu * vcpus, "thread_policy": threads, "numa": numa}


def run_length(samples: Any, interval: float, test: Any) -> float:
    """Seconds the newest samples satisfy ``test`` without a break (count x interval)."""
    return sum(1 for _ in takewhile(test, reversed(tuple(samples)))) * interval


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",")) if text else ()


def pack_floats(values: Any) -> str:
    """The wire form of a list of numbers in a call's facts (one JSON string is much cheaper to decode).

    Every number keeps its value exactly (the shortest text that reads back as the same float).
    """
    return ",".join(map(repr, map(float, values)))


def _window(samples: tuple[float, ...], interval: float, seconds: float | None) -> tuple[float, ...]:
    if seconds is None or interval <= 0:
        return samples
    n = max(1, int(seconds // interval))
    return samples[-n:]



_FIELDS: dict[type, frozenset[str]] = {}


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """A Host, Guest or VM from its wire form (fields it does not know are left out; lists become tuples)."""
    known = _FIELDS.get(cls) or _FIELDS.setdefault(cls, frozenset(f.name for f in fields(cls)))
    values = {k: v for k, v in data.items() if k in known}
    for name in ("load_avg", "numa", "hugepages", "dedicated_nodes"):
        if isinstance(values.get(name), list):
            values[name] = tuple(values[name])
    if cls is Host and "age" in data:
        values["fixed_age"] = data["age"]
    for name, text in (("pcpu_pct", "pcpu_text"), ("cpu_history", "history_text")):
        if name in data and text in known:  # a list (a facts file): the same as the packed text
            values[text] = pack_floats(data[name]) if isinstance(data[name], list) else str(data[name])
    if cls is Host and isinstance(values.get("guests"), list):
        values["guests"] = tuple(build(Guest, g) for g in values["guests"] if isinstance(g, dict))
    return cls(**values)


# --- the facts of the current call -------------------------------------------------

NO_FACTS = "no facts were attached to this call"


class CallFacts:
    """The facts of one plugin call: what host(), hosts(), missing(), vm(), vm_problem() and pending() read.

    ``payload`` is the call's facts as the service sends them: ``missing``, ``vm``, ``vm_problem`` and, in the
    full form, every host's fields under ``hosts`` (its Host is built on first use: most units read a few
    fields). The plugin worker's held facts (:mod:`vmsched.facts.held`) give instead ``hosts`` (the
    call's hosts with facts), ``lookup`` (host ID -> its Host) and ``found`` (the Hosts already made for these
    hosts, shared with the worker's other calls), and ``now``, the service's time of the call.
    """

    def __init__(self, payload: Any = None, *, hosts: Mapping[str, Any] | None = None,
                 lookup: Callable[[str], Host | None] | None = None, found: dict[str, Host] | None = None,
                 now: float = 0.0) -> None:
        payload = payload if isinstance(payload, dict) else {}
        if hosts is None or lookup is None:
            raw = payload.get("hosts")
            hosts, lookup = (raw if isinstance(raw, dict) else {}), self._from_fields
        self.hosts: Mapping[str, Any] = hosts  # host ID -> its facts (or a mark): the call's hosts with facts
        self.lookup = lookup
        self.found: dict[str, Host] = {} if found is None else found
        self.now = now  # the service's time of the call: a Host's age counts from it
        self.missing = {str(k): str(v) for k, v in (payload.get("missing") or {}).items()}
        vm_data = payload.get("vm")
        self.vm: VM | None = build(VM, vm_data) if isinstance(vm_data, dict) else None
        self.vm_problem: str | None = payload.get("vm_problem") if payload else NO_FACTS

    def host(self, host_id: str) -> Host | None:
        """The Host of ``host_id`` if it is one of the call's hosts with facts."""
        found = self.found.get(host_id)
        if found is None and host_id in self.hosts:
            found = self.lookup(host_id)
            if found is not None:
                self.found[host_id] = found
        return found

    def _from_fields(self, host_id: str) -> Host | None:
        data = self.hosts[host_id]
        return build(Host, {**data, "host_id": host_id}) if isinstance(data, dict) else None


class FactsMissing(Exception):
    """The facts this unit needs are missing: its call fails with this message alone (no traceback is logged)."""


#: The facts of the call being served: the plugin worker sets it around each call (``CALL.set``, ``CALL.reset``).
CALL: ContextVar[CallFacts] = ContextVar("vmsched.plugin.facts.CALL", default=CallFacts())


def host(host_id: str) -> Host | None:
    """The facts of ``host_id``, or None (see :func:`missing`)."""
    return CALL.get().host(host_id)


def hosts() -> dict[str, Host]:
    """Every host of this call that has facts, by host ID."""
    call = CALL.get()
    return {h: found for h in call.hosts if (found := call.host(h)) is not None}


def missing() -> dict[str, str]:
    """Hosts of this call without facts, with the reason (no agent, cannot be resolved)."""
    return dict(CALL.get().missing)


def vm() -> VM | None:
    """The call's VM with its memory and vCPUs, or None (:func:`vm_problem` says why)."""
    return CALL.get().vm


def vm_problem() -> str | None:
    return CALL.get().vm_problem


def pending(host_id: str) -> tuple[int, ...]:
    """Memory (MiB) of each VM vmsched ranked first on ``host_id`` moments ago that its facts may not show yet.

    Filled on calls about a VM of known size (:func:`vm`); see docs/stock-units.md, "Pending placements".
    """
    found = CALL.get().vm
    return tuple(found.pending.get(host_id, ())) if found is not None and isinstance(found.pending, dict) else ()
