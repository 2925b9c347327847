"""Hot-spot avoidance: move a movable guest's vCPUs off shared CPUs that stay saturated while others idle.

A vCPU confined to CPUs that were all at least ``hot_percent`` busy for K intervals, of a guest whose vCPUs
waited for a CPU more than its target (or, where libvirt reports no wait, with another busy vCPU confined to
the same CPUs), is moved to as many of the least busy shared CPUs, each at least ``cool_margin`` points less
busy on average over those intervals. One guest per hot set per interval: the one that waited most.
"""

from __future__ import annotations

from statistics import mean

from ..cpuset import CpuSet, fmt
from .config import TunerConfig
from .types import GuestView, Proposal, TuneInput

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
    busy_confined: dict[CpuSet, int] = {}
    for g in inp.guests.values():
        recent = g.recent(k)
        if recent and min(s.cpu_pct for s in recent) >= cfg.idle_percent:
            for cpus in g.pins.values():
                busy_confined[cpus] = busy_confined.get(cpus, 0) + 1
    out: list[Proposal] = []
    taken: set[CpuSet] = set()
    candidates = sorted(inp.guests.values(), key=lambda g: -_wait(g, k))
    for g in candidates:
        a = g.policy.adaptive
        if a is None or not a.may_move or g.policy.dedicated is not None:
            continue
        recent = g.recent(k)
        if recent is None:
            continue
        target = a.target_wait_percent or cfg.target_wait_percent
        waits = [s.wait_pct for s in recent]
        moves: dict[int, CpuSet] = {}
        for vcpu, cpus in sorted(g.pins.items()):
            if not cpus or not cpus <= hot or cpus in taken:
                continue
            if None in waits:  # no wait reported: judge by demand on the hot CPUs
                if busy_confined.get(cpus, 0) < 2:
                    continue
            elif min(waits) < target:  # type: ignore[type-var]
                continue
            ceiling = min(avg[c] for c in cpus) - cfg.cool_margin
            cool = sorted((c for c in inp.shared - hot if avg[c] <= ceiling), key=lambda c: (avg[c], c))
            if len(cool) < len(cpus):
                continue
            moves[vcpu] = frozenset(cool[: len(cpus)])
        if moves:
            after = {**g.pins, **moves}
            old = sorted({fmt(g.pins[v]) for v in moves})
            hot_text = ", ".join(f"CPU {c} {mean(s.pcpu_pct.get(c, 0.0) for s in host):.0f}%" for c in sorted(hot))
            why = (f"CPUs {', '.join(old)} saturated for {k} intervals ({hot_text}); vCPU wait "
                   + (f"{min(waits):.0f}% >= target {target:g}%" if None not in waits else "not reported, "
                      "other busy vCPUs share them")
                   + f"; moved to {', '.join(sorted({fmt(c) for c in moves.values()}))}")  # type: ignore[type-var]
            out.append(Proposal(g.uuid, NAME, "vcpus", after, why))
            taken |= {g.pins[v] for v in moves}
    return out


def _wait(g: GuestView, k: int) -> float:
    recent = g.recent(k) or []
    waits = [s.wait_pct for s in recent if s.wait_pct is not None]
    return mean(waits) if waits else 0.0
