"""Host facts on the bus: what a policy agent measured on its hypervisor.

Part of the versioned bus contract (:mod:`vmsched.messages`), with a
version of its own: a :class:`FactsMessage` carries the facts version ``v``
(:data:`FACTS_VERSION`), the publishing
agent's host ID, a per-agent-process ``instance`` and a sequence number
``seq`` (both for ordering), the collection time and the facts. Agents
publish it on the ``vmsched.events`` topic exchange with the routing key
``agent.<host>.facts`` (:func:`facts_key`).

Cost is kept proportional to change: every message carries the small host
summary; the guest list (``guests``) only when it changed since the agent's
last message, on a snapshot request, or every few intervals. ``guests`` is
``None`` when left out: the reader keeps the list it has (``guests_digest``
says which list that is).

A reader accepts messages of its own facts version and refuses others,
oversized ones (:data:`MAX_BYTES`), malformed ones and out-of-order ones
(:func:`read`).
Units: MiB for memory, % for CPU (100 = one whole CPU for a guest, all CPUs
for the host), seconds for times.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vmsched.messages import Versioned

#: Largest facts message a reader accepts, bytes of JSON.
MAX_BYTES = 4 << 20
#: Most guests in one message.
MAX_GUESTS = 20000
#: Version of the facts messages (their ``v``). Facts change version on their own: version 3 says, per NUMA
#: node, the free dedicated CPUs and whole cores, and each dedicated guest's thread, NUMA and emulator policies.
FACTS_VERSION = 3
#: The event name in the routing key.
FACTS_EVENT = "facts"


def facts_key(host_id: str) -> str:
    return f"agent.{host_id}.{FACTS_EVENT}"


class _Model(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="ignore")  # a newer agent may add fields


class NumaCell(_Model):
    id: int
    cpus: str = Field("", description="the cell's CPUs, libvirt CPU-set syntax")
    memory_mib: int = Field(0, ge=0, description="the cell's memory, MiB")


class HugePages(_Model):
    size_kib: int = Field(ge=1, description="page size, KiB")
    total: int = Field(0, ge=0, description="pages reserved")
    free: int = Field(0, ge=0, description="pages not in use")


class DedicatedGuest(_Model):
    wanted: int = Field(0, ge=0, description="dedicated CPUs the guest's vmsched policy asks for (with emulator "
                                              "isolate, one more for the emulator threads)")
    held: int = Field(0, ge=0, description="dedicated CPUs it holds on this host now (isolate: the siblings too)")
    thread_policy: str = Field("prefer", description="prefer, require (whole cores) or isolate (one thread per core)")
    numa: str = Field("any", description="any, or strict: every CPU and the memory in one NUMA node")
    emulator: str = Field("share", description="share, or isolate: one more dedicated CPU for the emulator threads")


class DedicatedNode(_Model):
    """The dedicated pool's room in one NUMA node."""

    node: int
    free_cpus: int = Field(0, ge=0, description="CPUs of the pool in the node no guest holds")
    free_cores: int = Field(0, ge=0, description="cores of the pool in the node whose every thread is free")
    free_core_cpus: int = Field(0, ge=0, description="CPUs of those free whole cores")


class HostFacts(_Model):
    """The host summary, sent with every message."""

    hostname: str = ""
    libvirt_uuid: str = Field("", description="libvirt's host UUID (capabilities host/uuid)")
    vdsm_id: str = Field("", description="/etc/vdsm/vdsm.id when present")
    sockets: int = Field(0, ge=0)
    cores: int = Field(0, ge=0, description="cores per socket")
    threads: int = Field(0, ge=0, description="threads per core")
    numa: list[NumaCell] = Field(default_factory=list)
    cpus: int = Field(0, ge=0, description="online CPUs")
    cpu_pct: float = Field(0.0, ge=0, description="host CPU use (user + system) over the last interval, % of all CPUs")
    pcpu_pct: list[float] = Field(default_factory=list, description="utilisation of each online pCPU over the last interval, %")
    load_avg: list[float] = Field(default_factory=list, description="1, 5 and 15 minute load averages")
    memory_total_mib: int = Field(0, ge=0)
    memory_free_mib: int = Field(0, ge=0, description="MemFree + Cached + Buffers + SReclaimable (oVirt's free)")
    memory_available_mib: int = Field(0, ge=0, description="MemAvailable")
    swap_total_mib: int = Field(0, ge=0)
    swap_used_mib: int = Field(0, ge=0)
    hugepages: list[HugePages] = Field(default_factory=list)
    dedicated_pool: str = Field("", description="the agent's dedicated CPU pool (CPU set)")
    shared_cpus: str = Field("", description="CPUs shared by guests without dedicated CPUs (CPU set)")
    allocations: dict[str, str] = Field(default_factory=dict, description="guest UUID -> its dedicated CPUs")
    dedicated_pool_cpus: int | None = Field(None, ge=0, description="CPUs in the dedicated pool")
    dedicated_free_cpus: int | None = Field(None, ge=0, description="CPUs of the pool no guest holds")
    dedicated_nodes: list[DedicatedNode] = Field(
        default_factory=list, description="per NUMA node: the pool's free CPUs and free whole cores")
    dedicated_guests: dict[str, DedicatedGuest] = Field(
        default_factory=dict, description="guest UUID -> dedicated CPUs wanted and held, for every guest whose "
                                          "policy this agent knows (running, defined or stored)")
    guests_running: int = Field(0, ge=0)
    guests_total: int = Field(0, ge=0)
    guest_memory_mib: int = Field(0, ge=0, description="sum of running guests' current balloon, MiB")
    guest_vcpus: int = Field(0, ge=0, description="sum of running guests' vCPUs")
    history_interval: float = Field(0.0, ge=0, description="seconds between two cpu_history samples")
    cpu_history: list[float] = Field(default_factory=list, description="host cpu_pct samples, oldest first")


class GuestFacts(_Model):
    uuid: str = Field(description="libvirt UUID: the oVirt engine's VM id")
    name: str = ""
    state: str = Field("", description="running, paused, shutoff, ... (libvirt's state)")
    vcpus: int = Field(0, ge=0)
    memory_mib: int = Field(0, ge=0, description="current balloon, MiB")
    max_memory_mib: int = Field(0, ge=0, description="maximum balloon, MiB")
    cpu_pct: float = Field(0.0, ge=0, description="CPU time over the last interval, % of the guest's vCPUs")
    has_policy: bool = False
    dedicated: bool = Field(False, description="the guest has dedicated pCPUs")
    dedicated_cpus: int = Field(0, ge=0, description="dedicated pCPUs it holds")
    pinned: bool = Field(False, description="its vmsched policy pins vCPUs or the emulator to given pCPUs")


class FactsMessage(_Model):
    """One facts message of one agent (its version is :data:`FACTS_VERSION`, not the bus contract's)."""

    v: int = Field(FACTS_VERSION, description="facts version")
    host_id: str = Field(min_length=1, max_length=256)
    instance: str = Field(min_length=1, max_length=64, description="changes when the agent restarts (seq restarts)")
    seq: int = Field(ge=0)
    time: float = Field(gt=0, description="UNIX time of the collection")
    interval: float = Field(gt=0, description="the agent's collection interval, seconds")
    reason: Literal["interval", "event", "snapshot"] = "interval"
    host: HostFacts
    guests: list[GuestFacts] | None = Field(None, max_length=MAX_GUESTS, description="None: unchanged")
    guests_digest: str = ""


class SnapshotRequest(Versioned):
    """A service replica asks every agent to publish its full facts now (on the ``vmsched.facts`` exchange)."""

    requester: str = Field("", max_length=256)


class Rejected(ValueError):
    """A facts message a reader does not use; ``reason`` is a metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def read(raw: bytes | str) -> FactsMessage:
    """The message in ``raw``, or :class:`Rejected` (oversized, malformed, version)."""
    if len(raw) > MAX_BYTES:
        raise Rejected("oversized", f"facts message of {len(raw)} bytes is larger than {MAX_BYTES}")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Rejected("malformed", f"facts message is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Rejected("malformed", "facts message is not a JSON object")
    data.pop("service", None)  # added by the event publisher
    try:
        message = FactsMessage.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise Rejected("malformed", f"facts message refused: {problems}") from None
    if message.v != FACTS_VERSION:
        raise Rejected("version", f"facts of version {message.v} from {message.host_id!r}: this reader "
                                  f"accepts {FACTS_VERSION}")
    return message
