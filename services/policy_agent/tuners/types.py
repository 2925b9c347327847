"""What the tuners read (samples with history, guests' bounds) and what they return (proposals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vmsched.cpuset import CpuSet, fmt

from ..policy.model import GuestPolicy

FIELDS = ("cpu_shares", "vcpu_quota", "vcpus")


@dataclass(frozen=True)
class GuestSample:
    """One guest over one interval."""

    cpu_pct: float  # mean use per vCPU, percent of one CPU
    wait_pct: float | None  # mean wait for a CPU per vCPU (vcpu.N.delay, else vcpu.N.wait), None: not reported


@dataclass(frozen=True)
class HostSample:
    pcpu_pct: dict[int, float]  # busy percent per host CPU over the interval


@dataclass
class GuestView:
    """A guest the tuners may consider: its policy, what is in force now, its recent samples (oldest first,
    only those since its last tuned change)."""

    uuid: str
    name: str
    policy: GuestPolicy
    nvcpus: int
    pins: dict[int, CpuSet]  # the vCPUs' allowed CPUs in force
    cpu_shares: int  # in force
    cap_percent: float | None  # in force (None: no cap)
    period: int
    samples: list[GuestSample] = field(default_factory=list)  # since its last move (what placement judges)
    since_change: int | None = None  # of those, how many since its last weight or cap change (None: all)

    def recent(self, k: int) -> list[GuestSample] | None:
        """The last ``k`` samples since the guest's vCPUs last moved (placement's view)."""
        return self.samples[-k:] if len(self.samples) >= k else None

    def settled(self, k: int) -> list[GuestSample] | None:
        """The last ``k`` samples since any tuned change of the guest (weight, cap or placement)."""
        n = len(self.samples) if self.since_change is None else min(len(self.samples), self.since_change)
        return self.samples[-k:] if n >= k else None


@dataclass
class TuneInput:
    shared: CpuSet  # the shared CPU set; pins never leave it
    host: list[HostSample]  # oldest first
    guests: dict[str, GuestView]

    def recent_host(self, k: int) -> list[HostSample] | None:
        return self.host[-k:] if len(self.host) >= k else None


@dataclass(frozen=True)
class Proposal:
    uuid: str
    tuner: str
    field: str  # one of FIELDS
    after: Any  # cpu_shares: int; vcpu_quota: cap percent (float); vcpus: {vcpu: CpuSet}
    reason: str


@dataclass(frozen=True)
class Decision:
    time: float
    uuid: str
    guest: str
    tuner: str
    field: str
    before: Any
    after: Any
    reason: str
    outcome: str  # applied | dry_run | refused

    def view(self) -> dict[str, Any]:
        return {"time": self.time, "tuner": self.tuner, "field": self.field, "before": _plain(self.before),
                "after": _plain(self.after), "reason": self.reason, "outcome": self.outcome}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): fmt(v) if isinstance(v, frozenset) else v for k, v in sorted(value.items())}
    return value
