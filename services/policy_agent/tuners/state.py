"""The tuned values in force: live-only overlays on a guest's static desired state.

The enforcer asks :meth:`TunedState.split` for what its config and its live domain should hold, so a
sweep or a drift repair keeps a tuned value instead of undoing it. An overlay belongs to one run of the
guest (its domain ID): when the guest stops or restarts it is dropped and the static policy is in force
again, unless the guest's adaptive block says ``keep_on_restart`` (then it is written to the config too,
for as long as this agent runs).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from ..policy.model import GuestPolicy
from ..policy.validation import Desired


@dataclass
class Overlay:
    run: int  # the domain ID of the run it was made for
    keep: bool = False
    cpu_shares: int | None = None
    cap_percent: float | None = None
    period: int | None = None
    vcpus: dict[int, CpuSet] = field(default_factory=dict)

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cpu_shares is not None:
            out["cpu_shares"] = self.cpu_shares
        if self.cap_percent is not None:
            out["cap_percent"] = self.cap_percent
            out["vcpu_quota"] = quota(self.cap_percent, self.period)
        if self.vcpus:
            out["vcpus"] = {str(i): cpuset.fmt(c) for i, c in sorted(self.vcpus.items())}
        return out


def quota(cap_percent: float, period: int | None) -> int:
    return int(round((period or 100000) * cap_percent / 100.0))


class TunedState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._overlays: dict[str, Overlay] = {}

    def get(self, uuid: str) -> Overlay | None:
        with self._lock:
            return self._overlays.get(uuid)

    def set(self, uuid: str, run: int, policy: GuestPolicy, field_name: str, value: Any) -> None:
        keep = bool(policy.adaptive and policy.adaptive.keep_on_restart)
        with self._lock:
            o = self._overlays.get(uuid)
            if o is None or (o.run != run and not o.keep):
                o = self._overlays[uuid] = Overlay(run, keep)
            o.run, o.keep = run, keep
            if field_name == "cpu_shares":
                o.cpu_shares = int(value)
            elif field_name == "vcpu_quota":
                o.cap_percent, o.period = float(value), policy.effective_period() or 100000
            else:
                o.vcpus = {**o.vcpus, **value}

    def drop(self, uuid: str) -> None:
        with self._lock:
            self._overlays.pop(uuid, None)

    def split(self, uuid: str, desired: Desired, run: int | None, policy: GuestPolicy | None,
              shared: CpuSet) -> tuple[Desired, Desired]:
        """(what the persistent config should hold, what the live domain should hold). ``run``: the guest's
        domain ID, None when it is not running. The overlay is dropped when the run it was made for ended or
        the policy no longer has an adaptive block."""
        with self._lock:
            o = self._overlays.get(uuid)
            if o is None:
                return desired, desired
            gone = policy is None or policy.adaptive is None or policy.dedicated is not None
            if gone or (not o.keep and run != o.run):
                del self._overlays[uuid]
                return desired, desired
            if any(not c <= shared for c in o.vcpus.values()):  # the pool grew under a moved vCPU
                o.vcpus = {}
            live = _merge(desired, o)
            return (live if o.keep else desired), live


def _merge(d: Desired, o: Overlay) -> Desired:
    sched = dict(d.sched)
    if o.cpu_shares is not None:
        sched["cpu_shares"] = o.cpu_shares
    if o.cap_percent is not None:
        sched["vcpu_quota"] = quota(o.cap_percent, o.period)
        sched["vcpu_period"] = o.period or 100000
    vcpus = {i: o.vcpus.get(i, c) for i, c in d.vcpus.items()} if o.vcpus and d.vcpus is not None else d.vcpus
    return dataclasses.replace(d, vcpus=vcpus, sched=sched)
