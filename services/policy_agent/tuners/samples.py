"""Turn raw counters into the tuners' samples: per-CPU use from ``/proc/stat``, per-guest vCPU use and wait
from libvirt's bulk stats (``vcpu.N.time``, ``vcpu.N.delay``, else ``vcpu.N.wait``, in ns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..facts import arithmetic as calc
from .types import GuestSample, HostSample


@dataclass(frozen=True)
class VcpuCounters:
    nvcpus: int
    time_ns: int
    wait_ns: int | None  # None: neither vcpu.N.delay nor vcpu.N.wait reported
    run: int  # domain ID


def vcpu_counters(record: dict[str, Any], run: int) -> VcpuCounters:
    n = int(record.get("vcpu.current", record.get("vcpu.maximum", 0)) or 0)
    total, wait, reported = 0, 0, True
    for i in range(n):
        total += int(record.get(f"vcpu.{i}.time", 0) or 0)
        key = f"vcpu.{i}.delay" if f"vcpu.{i}.delay" in record else f"vcpu.{i}.wait"
        if key in record:
            wait += int(record[key] or 0)
        else:
            reported = False
    if n and not any(f"vcpu.{i}.time" in record for i in range(n)):
        total = int(record.get("cpu.time", 0) or 0)
    return VcpuCounters(n, total, wait if reported and n else None, run)


def guest_sample(before: VcpuCounters | None, after: VcpuCounters, seconds: float) -> GuestSample | None:
    """The interval between two readings; None without a comparable earlier one (first reading, restart)."""
    if before is None or seconds <= 0 or before.run != after.run or after.nvcpus < 1:
        return None
    span = seconds * 1e9 * after.nvcpus
    cpu = max(0.0, min(100.0, (after.time_ns - before.time_ns) / span * 100.0))
    wait = None
    if after.wait_ns is not None and before.wait_ns is not None:
        wait = max(0.0, min(100.0, (after.wait_ns - before.wait_ns) / span * 100.0))
    return GuestSample(cpu, wait)


class HostCounter:
    """Per-CPU use between consecutive ``/proc/stat`` readings."""

    def __init__(self) -> None:
        self._before: dict[int, calc.CpuTimes] = {}

    def sample(self, stat_text: str) -> HostSample | None:
        _, per = calc.parse_stat(stat_text)
        before, self._before = self._before, per
        if not before:
            return None
        return HostSample({c: calc.busy_pct(before.get(c), t) for c, t in per.items()})
