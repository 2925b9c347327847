"""Prometheus metrics of the policy agent (names are part of the interface)."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

from vmsched.facts.model import HostFacts
from vmsched.metrics import REGISTRY

#: An event is applied in milliseconds; a sweep of many guests or a slow libvirtd takes seconds.
_FAST = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)

#: Known label values, created at 0 on import so that rates hold from the first event.
APPLICATION_OUTCOMES = ("ok", "error", "refused")
#: libvirt's lifecycle events, each the name of its VIR_DOMAIN_EVENT_* constant (virt/connection.py).
LIFECYCLE_EVENTS = ("defined", "undefined", "started", "suspended", "resumed", "stopped", "shutdown", "pmsuspended",
                    "crashed")
#: libvirt domain events: the lifecycle ones and those of the reboot/tunable/metadata callbacks.
EVENT_NAMES = (*LIFECYCLE_EVENTS, "reboot", "tunable", "metadata")
#: Repair triggers: an event (enforce/jobs.py Job.trigger) or a sweep (agent.py).
REPAIR_TRIGGERS = (*EVENT_NAMES, "event", "sweep", "start", "reconnect", "pool")
ERROR_KINDS = ("apply", "validation", "overlap", "checkpoint", "libvirt", "store", "facts")

GUESTS_MANAGED = Gauge(
    "vmsched_agent_guests_managed", "Guests on this host that carry a vmsched policy", registry=REGISTRY
)
APPLICATIONS = Counter(
    "vmsched_agent_policy_applications_total",
    "Policy applications (set/delete/pool change), by outcome (ok, error; refused: a policy set rejected by validation)",
    ["outcome"],
    registry=REGISTRY,
)
REPAIRS = Counter(
    "vmsched_agent_repairs_total",
    "Guests whose pins or scheduler parameters had to be (re)written, by trigger",
    ["trigger"],
    registry=REGISTRY,
)
DRIFT = Counter(
    "vmsched_agent_drift_corrections_total",
    "Changes made behind the agent's back (TUNABLE event) that it restored",
    registry=REGISTRY,
)
EVENT_TO_APPLIED = Histogram(
    "vmsched_agent_event_to_applied_seconds",
    "From a libvirt event to the guest's policy verified (and repaired) in place, by event",
    ["event"],
    buckets=_FAST,
    registry=REGISTRY,
)
RECONNECTS = Counter(
    "vmsched_agent_libvirt_reconnects_total", "Connections to libvirt re-opened after a loss", registry=REGISTRY
)
CONNECTED = Gauge("vmsched_agent_libvirt_connected", "1 while the agent holds a libvirt connection", registry=REGISTRY)
DEDICATED_CPUS = Gauge(
    "vmsched_agent_dedicated_cpus", "CPUs of the dedicated pool, by state (allocated, free)", ["state"], registry=REGISTRY
)
RECONCILE_DURATION = Histogram(
    "vmsched_agent_reconcile_duration_seconds", "Duration of one reconcile sweep", buckets=_FAST, registry=REGISTRY
)
EVENTS = Counter(
    "vmsched_agent_events_total", "libvirt domain events received, by event", ["event"], registry=REGISTRY
)
DEDICATED_OVERLAPS = Gauge(
    "vmsched_agent_dedicated_overlaps",
    "Running guests allowed on a CPU dedicated to another guest, found by the last sweep (should be 0)",
    registry=REGISTRY,
)
FOREIGN_IN_POOL = Gauge(
    "vmsched_agent_foreign_pins_in_pool",
    "Running guests pinned by their manager (no vmsched policy) into the dedicated pool, found by the last sweep",
    registry=REGISTRY,
)
ERRORS = Counter(
    "vmsched_agent_errors_total",
    "Errors, by kind (apply, validation, overlap, checkpoint, libvirt)",
    ["kind"],
    registry=REGISTRY,
)
FACTS_COLLECT_CPU = Histogram(
    "vmsched_agent_facts_collect_cpu_seconds", "CPU time of the agent's process for one host facts collection",
    buckets=_FAST, registry=REGISTRY,
)


for _metric, _values in ((APPLICATIONS, APPLICATION_OUTCOMES), (EVENTS, EVENT_NAMES), (EVENT_TO_APPLIED, EVENT_NAMES),
                         (REPAIRS, REPAIR_TRIGGERS), (ERRORS, ERROR_KINDS), (DEDICATED_CPUS, ("allocated", "free"))):
    for _value in _values:
        _metric.labels(_value)


# --- this host, from the agent's own facts collections (facts/reporter.py) -------------------------------
# The agent is the one exporter of its host's figures (the services' facts caches export only the age of
# each host's facts: vmsched_facts_age_seconds). Registered at the first collection, so an agent that
# collects no facts (no bus, or --facts-interval 0) exports none rather than zeros that read as an idle,
# empty host. Labelled by Prometheus's `instance` (the agent), never by a host ID.
HOST_CPU = Gauge(
    "vmsched_agent_host_cpu_ratio", "Host CPU use (user + system) over the last facts interval, 0-1 of all online CPUs",
    registry=None,
)
HOST_CPUS = Gauge("vmsched_agent_host_cpus", "Online CPUs of the host", registry=None)
HOST_MEMORY = Gauge(
    "vmsched_agent_host_memory_bytes",
    "Host memory, by kind (total; free: MemFree + Cached + Buffers + SReclaimable, oVirt's free; available: MemAvailable)",
    ["kind"], registry=None,
)
HOST_GUESTS = Gauge("vmsched_agent_host_guests", "Guests on the host, by state (running, total)", ["state"], registry=None)
_host_lock = threading.Lock()
_host_registered = False
_MIB = 1024 * 1024


def observe_host(host: HostFacts) -> None:
    """Set this host's gauges from one facts collection."""
    global _host_registered
    with _host_lock:
        if not _host_registered:
            for gauge in (HOST_CPU, HOST_CPUS, HOST_MEMORY, HOST_GUESTS):
                REGISTRY.register(gauge)
            _host_registered = True
    HOST_CPU.set(host.cpu_pct / 100)
    HOST_CPUS.set(host.cpus)
    for kind in ("total", "free", "available"):
        HOST_MEMORY.labels(kind).set(getattr(host, f"memory_{kind}_mib") * _MIB)
    HOST_GUESTS.labels("running").set(host.guests_running)
    HOST_GUESTS.labels("total").set(host.guests_total)
