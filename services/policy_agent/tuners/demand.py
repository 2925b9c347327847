"""Weight follows demand: raise a starved guest's weight within its bounds, decay it to the base when idle.

Starved: the vCPUs waited for a CPU more than the target for K intervals (vcpu.N.delay or vcpu.N.wait);
where libvirt reports neither, a guest using at least 95 % of its cap in force for K intervals. Idle: below
``idle_percent`` for K intervals; the weight then steps back towards the static (base) weight.
"""

from __future__ import annotations

from ..plural import plural
from .config import TunerConfig
from .types import Proposal, TuneInput

NAME = "demand"


def propose(inp: TuneInput, cfg: TunerConfig) -> list[Proposal]:
    out: list[Proposal] = []
    k = cfg.hysteresis
    for g in inp.guests.values():
        a = g.policy.adaptive
        if a is None or a.weight is None or (recent := g.settled(k)) is None:
            continue
        lo, hi = a.weight
        base = g.policy.base_weight()
        now = g.cpu_shares
        target = a.target_wait_percent or cfg.target_wait_percent
        waits = [s.wait_pct for s in recent]
        if None not in waits:
            starved = min(waits) >= target  # type: ignore[type-var]
            why = f"vCPU wait {min(waits):.0f}% >= target {target:g}% for {plural(k, 'interval')}"  # type: ignore[type-var]
        else:
            cap = g.cap_percent
            starved = cap is not None and min(s.cpu_pct for s in recent) >= 0.95 * cap
            why = f"CPU use at its cap {cap}% for {plural(k, 'interval')} (no vCPU wait reported)"
        idle = max(s.cpu_pct for s in recent) < cfg.idle_percent
        if starved and now < hi:
            after = min(hi, max(lo, int(round(now * cfg.weight_step))))
            out.append(Proposal(g.uuid, NAME, "cpu_shares", after, f"starved: {why}; weight {now} -> {after}"
                                f" (max {hi})"))
        elif idle and now > base:
            after = max(base, int(round(now / cfg.weight_step)))
            out.append(Proposal(g.uuid, NAME, "cpu_shares", after,
                                f"idle: CPU use below {cfg.idle_percent:g}% for {plural(k, 'interval')}; weight {now} ->"
                                f" {after} (base {base})"))
        elif idle and now < base:
            out.append(Proposal(g.uuid, NAME, "cpu_shares", base, f"idle: back to the base weight {base}"))
    return out
