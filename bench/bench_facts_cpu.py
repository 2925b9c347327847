"""CPU time per process group from /proc, for bench_gateway_facts.py.

Wall-clock throughput swings with whatever else the machine runs; CPU time per
request, read from ``/proc/<pid>/stat`` (utime + stime, exact to the clock
tick), does much less. A :class:`CpuMeter` is given named groups of root
processes; each group counts its roots and every descendant (plugin workers),
so a stack's figures are: gateway, scoring (+ its workers), discovery,
balancer (+ workers), and the shared processes (RabbitMQ, the facts feeder).
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            kids.setdefault(int(fields[1]), []).append(int(entry))  # fields[1]: the parent's pid
    return kids


def descendants(roots: list[int], kids: dict[int, list[int]] | None = None) -> list[int]:
    kids = _children() if kids is None else kids
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def ticks(pids: list[int]) -> dict[int, int]:
    found = {}
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            found[pid] = int(fields[11]) + int(fields[12])  # utime + stime
    return found


def rabbitmq_pids() -> list[int]:
    """The RabbitMQ server's Erlang VM (not rabbitmqctl's)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"beam" in cmd and b"rabbit\x00boot" in cmd:
                pids.append(int(entry))
    return pids


class CpuMeter:
    """CPU seconds each named group used between :meth:`start` and :meth:`stop`.

    A group's descendants (plugin workers) are counted apart as ``<group> workers``: those found at start, those
    started during the run (all their CPU), and those that ended during it (reaped: the roots' cutime + cstime,
    which holds their whole life's CPU).
    """

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self._pids: dict[str, list[int]] = {}
        self._before: dict[int, int] = {}
        self._reaped: dict[int, int] = {}

    def start(self) -> None:
        kids = _children()
        self._pids = {}
        for name, roots in self.groups.items():
            self._pids[name] = list(roots)
            below = [p for p in descendants(roots, kids) if p not in roots]
            if below:
                self._pids[f"{name} workers"] = below
        self._before = ticks([p for pids in self._pids.values() for p in pids])
        self._reaped = _reaped([p for roots in self.groups.values() for p in roots])

    def pids(self, name: str) -> list[int]:
        return self._pids.get(name, [])

    def stop(self) -> dict[str, float]:
        kids = _children()
        reaped = _reaped([p for roots in self.groups.values() for p in roots])
        out: dict[str, float] = {}
        for name, roots in self.groups.items():
            below = set(descendants(roots, kids)) - set(roots) | set(self._pids.get(f"{name} workers", ()))
            for group, pids in ((name, list(roots)), (f"{name} workers", sorted(below))):
                after = ticks(pids)
                used = sum(after[p] - self._before.get(p, 0) for p in after)  # new processes: all their CPU
                if group != name:
                    used += sum(reaped.get(r, 0) - self._reaped.get(r, 0) for r in roots)
                if pids or used:
                    out[group] = used / TICK
        return out


def _reaped(pids: list[int]) -> dict[int, int]:
    """cutime + cstime of each process: the CPU of its children that ended and were waited for."""
    found = {}
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            found[pid] = int(fields[13]) + int(fields[14])
    return found
