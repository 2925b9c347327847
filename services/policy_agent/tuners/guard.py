"""Every proposal, built-in or from a plugin, is checked here before it is applied: the guest's adaptive
bounds and static policy, and the pool. A refusal names its reason."""

from __future__ import annotations

from typing import Any

from vmsched import cpuset

from ..policy.model import QUOTA_MIN, SHARES_MAX, SHARES_MIN
from .types import FIELDS, GuestView, Proposal


def refusal(p: Proposal, g: GuestView | None, shared: cpuset.CpuSet) -> str | None:
    """Why ``p`` may not be applied, or None."""
    if g is None:
        return "unknown guest (no adaptive policy on this host)"
    a = g.policy.adaptive
    if a is None:
        return "the guest has no adaptive block"
    if p.field not in FIELDS:
        return f"unknown field {p.field!r}; known: {', '.join(FIELDS)}"
    if p.field == "cpu_shares":
        return _weight(p.after, a.weight)
    if p.field == "vcpu_quota":
        return _cap(p.after, a.cap_percent, g.period)
    return _pins(p.after, g, shared)


def _weight(value: Any, bounds: tuple[int, int] | None) -> str | None:
    if bounds is None:
        return "the guest's adaptive block has no weight range"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"weight {value!r} is not an integer"
    if not SHARES_MIN <= value <= SHARES_MAX:
        return f"weight {value} outside libvirt's range {SHARES_MIN}-{SHARES_MAX}"
    if not bounds[0] <= value <= bounds[1]:
        return f"weight {value} outside the guest's range [{bounds[0]}, {bounds[1]}]"
    return None


def _cap(value: Any, bounds: tuple[float, float] | None, period: int) -> str | None:
    if bounds is None:
        return "the guest's adaptive block has no cap range"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"cap {value!r} is not a number"
    if not bounds[0] <= value <= bounds[1]:
        return f"cap {value:g}% outside the guest's range [{bounds[0]:g}, {bounds[1]:g}]"
    if period * value / 100.0 < QUOTA_MIN:
        return f"cap {value:g}% of a {period} us period is below libvirt's minimum quota {QUOTA_MIN} us"
    return None


def _pins(value: Any, g: GuestView, shared: cpuset.CpuSet) -> str | None:
    if g.policy.dedicated is not None:
        return "the guest has dedicated CPUs: its pins are never tuned"
    if g.policy.adaptive is None or not g.policy.adaptive.may_move:
        return "the guest's adaptive block does not allow moving (may_move)"
    if not isinstance(value, dict) or not value:
        return "vcpus must map vCPU numbers to CPU sets"
    for vcpu, cpus in value.items():
        if not isinstance(vcpu, int) or isinstance(vcpu, bool) or not 0 <= vcpu < g.nvcpus:
            return f"vCPU {vcpu!r} does not exist (the guest has {g.nvcpus})"
        if not isinstance(cpus, frozenset) or not cpus:
            return f"vCPU {vcpu}: empty or malformed CPU set"
        if not cpus <= shared:
            return (f"vCPU {vcpu} to {cpuset.fmt(cpus)}: {cpuset.named(cpus - shared, 'is', 'are')} outside the shared"
                    f" set {cpuset.fmt(shared)} (the dedicated pool is never overcommitted)")
    return None
