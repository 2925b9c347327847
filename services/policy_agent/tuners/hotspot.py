"""Hot-spot avoidance: move a movable guest's vCPUs off shared CPUs that stay saturated while others idle.

A vCPU confined to CPUs that were all at least ``hot_percent`` busy for K intervals, of a guest whose vCPUs
waited for a CPU more than its target (or, where libvirt reports no wait, with another busy vCPU confined to
the same CPUs), is moved to as many of the least busy shared CPUs, each at least ``cool_margin`` points less
busy on average over those intervals. When no CPU is that idle (the host is busy with other work too, as on a
small test machine) and at least two busy vCPUs of tuned guests compete for the hot CPUs with their wait
above target, the destination is a CPU no busy tuned vCPU is confined to and no busier than the hot one.
One guest per hot set per interval: the one that waited most.

:func:`pending` says, from the last interval alone, which hot CPUs a move may soon relieve: the engine holds
back weight and cap changes there (placement first).
"""

from __future__ import annotations

import collections
from statistics import mean
from typing import Callable

from vmsched.cpuset import CpuSet, fmt, named

from ..plural import plural
from .config import TunerConfig
from .types import GuestSample, GuestView, Proposal, TuneInput

NAME = "hotspot"


def propose(inp: TuneInput, cfg: TunerConfig) -> list[Proposal]:
    k = cfg.hysteresis
    host = inp.recent_host(k)
    if host is None:
        return []
    util = {c: min(s.pcpu_pct.get(c, 0.0) for s in host) for c in inp.shared}  # held for all K intervals
    avg = {c: mean(s.pcpu_pct.get(c, 0.0) for s in host) for c in inp.shared}
    hot = {c for c, u in util.items() if u >= cfg.hot_percent}
    if not hot:
        return []
    busy_confined, occupied = _busy(inp, cfg, lambda g: g.recent(k))
    out: list[Proposal] = []
    taken: set[CpuSet] = set()
    for g in sorted(inp.guests.values(), key=lambda g: -_wait(g, k)):
        a = g.policy.adaptive
        if a is None or not a.may_move or g.policy.dedicated is not None or (recent := g.recent(k)) is None:
            continue
        target = a.target_wait_percent or cfg.target_wait_percent
        waits = [s.wait_pct for s in recent]
        reported = None not in waits
        moves: dict[int, CpuSet] = {}
        how = ""
        for vcpu, cpus in sorted(g.pins.items()):
            if not cpus or not cpus <= hot or cpus in taken:
                continue
            shared_with = busy_confined.get(cpus, 0)
            if reported and min(waits) < target:  # type: ignore[type-var]
                continue
            if not reported and shared_with < 2:  # no wait reported: judge by demand on the hot CPUs
                continue
            ceiling = min(avg[c] for c in cpus) - cfg.cool_margin
            idle = sorted((c for c in inp.shared - hot if avg[c] <= ceiling), key=lambda c: (avg[c], c))
            # the whole host may be busy with other work: then a CPU no busy tuned vCPU is confined to beats
            # one where two of them compete, judged by the guests' own wait
            free = sorted((c for c in inp.shared - cpus - occupied if avg[c] <= min(avg[h] for h in cpus)),
                          key=lambda c: (avg[c], c)) if reported and shared_with >= 2 else []
            dest = idle if len(idle) >= len(cpus) else free
            if len(dest) < len(cpus):
                continue
            how = "idle" if dest is idle else "no busy tuned vCPU confined there"
            moves[vcpu] = frozenset(dest[: len(cpus)])
            occupied |= moves[vcpu]
        if moves:
            after = {**g.pins, **moves}
            left = frozenset().union(*(g.pins[v] for v in moves))
            hot_text = ", ".join(f"CPU {c} {mean(s.pcpu_pct.get(c, 0.0) for s in host):.0f}%" for c in sorted(hot))
            why = (f"{named(left)} saturated for {plural(k, 'interval')} ({hot_text}); vCPU wait "
                   + (f"{min(waits):.0f}% >= target {target:g}%" if reported else "not reported, "  # type: ignore
                      "other busy vCPUs share them")
                   + f"; moved to {', '.join(sorted({fmt(c) for c in moves.values()}))} ({how})")
            out.append(Proposal(g.uuid, NAME, "vcpus", after, why))
            taken |= {g.pins[v] for v in moves}
    return out


def _busy(inp: TuneInput, cfg: TunerConfig, samples: Callable[[GuestView], list[GuestSample] | None],
          ) -> tuple[collections.Counter[CpuSet], set[int]]:
    """How many busy vCPUs of tuned guests are confined to each CPU set, and the shared CPUs they are confined to;
    busy: at least half ``idle_percent`` in each of ``samples(guest)``."""
    busy: collections.Counter[CpuSet] = collections.Counter()
    occupied: set[int] = set()
    for g in inp.guests.values():
        recent = samples(g)
        if recent and min(s.cpu_pct for s in recent) >= cfg.idle_percent / 2:
            busy.update(g.pins.values())
            occupied.update(*(cpus for cpus in g.pins.values() if cpus < inp.shared))
    return busy, occupied


def _wait(g: GuestView, k: int) -> float:
    recent = g.recent(k) or []
    waits = [s.wait_pct for s in recent if s.wait_pct is not None]
    return mean(waits) if waits else 0.0


def pending(inp: TuneInput, cfg: TunerConfig) -> CpuSet:
    """Hot CPUs a move may relieve soon, judged on the last interval: a movable guest's vCPU confined to CPUs
    at least ``hot_percent`` busy, waiting above its target (or, with no wait reported, with another busy vCPU
    confined there), with somewhere to go: a shared CPU ``cool_margin`` less busy, or one no busier where no
    busy tuned vCPU is confined."""
    if not inp.host:
        return frozenset()
    last = inp.host[-1].pcpu_pct
    hot = {c for c in inp.shared if last.get(c, 0.0) >= cfg.hot_percent}
    if not hot:
        return frozenset()
    busy, occupied = _busy(inp, cfg, lambda g: g.samples[-1:])
    out: set[int] = set()
    for g in inp.guests.values():
        a = g.policy.adaptive
        if a is None or not a.may_move or g.policy.dedicated is not None or not g.samples:
            continue
        wait = g.samples[-1].wait_pct
        target = a.target_wait_percent or cfg.target_wait_percent
        for cpus in g.pins.values():
            if not cpus or not cpus <= hot or not (wait >= target if wait is not None else busy.get(cpus, 0) >= 2):
                continue
            least = min(last.get(c, 0.0) for c in cpus)
            if any(last.get(c, 0.0) <= least - cfg.cool_margin or (c not in occupied and last.get(c, 0.0) <= least)
                   for c in inp.shared - cpus):
                out |= cpus
    return frozenset(out)
