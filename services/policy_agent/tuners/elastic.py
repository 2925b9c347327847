"""Elastic cap: loosen a capped guest's cap while the shared CPUs have slack, tighten it under contention.

Loosen: the guest used at least 90 % of its cap for K intervals and the shared set was below
``slack_percent`` busy for K intervals; the cap rises by ``cap_step`` points up to the top of its range.
Tighten: the shared set was at least ``hot_percent`` busy for K intervals; a cap above the base (the static
cap, else the top of the range) steps back towards it, and one at the base may go down to the range's min.
"""

from __future__ import annotations

from statistics import mean

from ..plural import plural
from .config import TunerConfig
from .types import Proposal, TuneInput

NAME = "elastic_cap"


def propose(inp: TuneInput, cfg: TunerConfig) -> list[Proposal]:
    k = cfg.hysteresis
    host = inp.recent_host(k)
    if host is None or not inp.shared:
        return []
    use = [mean(s.pcpu_pct.get(c, 0.0) for c in inp.shared) for s in host]
    slack, contention = max(use) < cfg.slack_percent, min(use) >= cfg.hot_percent
    out: list[Proposal] = []
    for g in inp.guests.values():
        a = g.policy.adaptive
        if a is None or a.cap_percent is None or (recent := g.settled(k)) is None:
            continue
        lo, hi = a.cap_percent
        now = g.cap_percent if g.cap_percent is not None else hi
        base = g.policy.cap_percent or hi  # the static cap, else the top of the range
        if slack and now < hi and min(s.cpu_pct for s in recent) >= 0.9 * now:
            after = min(hi, now + cfg.cap_step)
            out.append(Proposal(g.uuid, NAME, "vcpu_quota", after,
                                f"slack: shared CPUs {max(use):.0f}% busy (< {cfg.slack_percent:g}%) and the guest at"
                                f" its cap for {plural(k, 'interval')}; cap {now:g}% -> {after:g}% (max {hi:g}%)"))
        elif contention and now > lo:
            after = max(base, now - cfg.cap_step) if now > base else max(lo, now - cfg.cap_step)
            out.append(Proposal(g.uuid, NAME, "vcpu_quota", after,
                                f"contention: shared CPUs {min(use):.0f}% busy (>= {cfg.hot_percent:g}%) for"
                                f" {plural(k, 'interval')}; cap {now:g}% -> {after:g}% (min {lo:g}%)"))
    return out
