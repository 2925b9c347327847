"""One tuning round: samples in, decisions out.

Keeps the history (host samples, each guest's samples since its last move and how many since its last weight
or cap change), runs the tuners in order (placement first), checks each proposal (:mod:`.guard`), applies
hysteresis and the rate limits, and remembers the last decisions per guest.
Nothing here touches libvirt: the caller applies the ``applied`` decisions.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Iterable

from vmsched.cpuset import named

from ..plural import plural
from . import demand, elastic, hotspot
from .config import TunerConfig
from .guard import refusal
from .types import Decision, GuestSample, GuestView, HostSample, Proposal, TuneInput

Tuner = Callable[[TuneInput, TunerConfig], list[Proposal]]
BUILTIN: dict[str, Tuner] = {hotspot.NAME: hotspot.propose, demand.NAME: demand.propose, elastic.NAME: elastic.propose}
KEEP_DECISIONS = 20  # per guest, for explain


class Engine:
    def __init__(self, config: TunerConfig, tuners: dict[str, Tuner] | None = None) -> None:
        self.config = config
        self.tuners = dict(BUILTIN if tuners is None else tuners)
        depth = max(config.hysteresis, 2) + 1
        self._host: collections.deque[HostSample] = collections.deque(maxlen=depth)
        self._guests: dict[str, collections.deque[GuestSample]] = {}
        self._depth = depth
        self._changed: dict[str, int] = {}  # guest -> samples since its last weight or cap change
        self.decisions: dict[str, collections.deque[Decision]] = {}

    def observe(self, host: HostSample, guests: dict[str, GuestSample]) -> None:
        self._host.append(host)
        for uuid in list(self._guests):
            if uuid not in guests:
                del self._guests[uuid]
                self._changed.pop(uuid, None)
        for uuid, sample in guests.items():
            self._guests.setdefault(uuid, collections.deque(maxlen=self._depth)).append(sample)
            if uuid in self._changed:
                self._changed[uuid] += 1

    def input(self, shared: frozenset[int], guests: Iterable[GuestView]) -> TuneInput:
        # copies: a round's decisions are assumed in force on them (step), not on the caller's
        views = {g.uuid: dataclasses.replace(g, pins=dict(g.pins), samples=list(self._guests.get(g.uuid, ())),
                                             since_change=self._changed.get(g.uuid)) for g in guests}
        return TuneInput(shared, list(self._host), views)

    def step(self, inp: TuneInput, extra: Iterable[Proposal] = (), now: float | None = None) -> list[Decision]:
        """Run the tuners over ``inp`` (plus ``extra`` proposals, e.g. from plugins); return every decision:
        applied (dry_run), refused by the guard, or deferred (a rate limit, or held back for a move).

        The tuners cooperate. They run in order, placement first: a later tuner sees the round's earlier
        decisions as applied (in dry-run too), and weight and cap changes wait on CPUs a move may relieve
        (:func:`hotspot.pending`, and the CPUs a move of this round leaves). A weight or cap change restarts only
        the weight and cap tuners' hysteresis; the samples placement judges are kept until the guest moves."""
        now = time.time() if now is None else now
        held = set(hotspot.pending(inp, self.config)) if hotspot.NAME in self.tuners else set()
        rnd = _Round()
        out: list[Decision] = []
        for tuner in self.tuners.values():
            out.extend(d for p in tuner(inp, self.config) if (d := self._decide(p, inp, held, rnd, now)) is not None)
        out.extend(d for p in extra if (d := self._decide(p, inp, held, rnd, now)) is not None)
        return out

    def _decide(self, p: Proposal, inp: TuneInput, held: set[int], rnd: "_Round", now: float) -> Decision | None:
        g = inp.guests.get(p.uuid)
        before = _current(g, p.field)
        why = refusal(p, g, inp.shared)
        if why is None and _same(before, p.after):
            return None  # nothing to change
        if why is None and (p.uuid, p.field) in rnd.fields:
            why = f"{p.field} of this guest already changed in this interval"
        if why is None and g is not None and p.field != "vcpus":
            if on := frozenset().union(*g.pins.values()) & held:
                why = (f"held back: a move off {named(on)} may relieve {'it' if len(on) == 1 else 'them'} first"
                       " (placement before weight and cap)")
        if why is None and rnd.per_guest[p.uuid] >= self.config.max_guest_changes:
            why = f"rate limit: at most {plural(self.config.max_guest_changes, 'change')} per guest per interval"
        if why is None and rnd.changes >= self.config.max_changes:
            why = f"rate limit: at most {plural(self.config.max_changes, 'change')} per interval on the host"
        if why is None:
            rnd.per_guest[p.uuid] += 1
            rnd.changes += 1
            rnd.fields.add((p.uuid, p.field))
        deferred = why is not None and why.startswith(("rate limit", "held back"))
        outcome = ("dry_run" if self.config.dry_run else "applied") if why is None else \
            ("deferred" if deferred else "refused")
        d = Decision(now, p.uuid, g.name if g else p.uuid, p.tuner, p.field, before, p.after,
                     p.reason if why is None else f"{outcome}: {why} (proposed because: {p.reason})", outcome)
        self.decisions.setdefault(p.uuid, collections.deque(maxlen=KEEP_DECISIONS)).append(d)
        if why is None:
            assert g is not None  # the guard refuses proposals for unknown guests
            if p.field == "vcpus":  # its samples no longer describe it, nor do the host's CPU use before the move:
                held |= set().union(*(g.pins[v] for v in p.after if v in g.pins))  # weight/cap wait where it left
                self._guests.pop(p.uuid, None)  # judge the next move on K fresh intervals (else a second guest
                self._changed.pop(p.uuid, None)  # follows the first), also in dry-run: no flood
                self._host.clear()
            else:  # hysteresis: the condition must hold K intervals again for weight and cap, not for placement
                self._changed[p.uuid] = 0
            _assume(g, p)  # the round's later tuners see it applied
        return d

    def amend(self, old: Decision, new: Decision) -> None:
        """Replace a kept decision (applying it failed: explain must say so)."""
        kept = self.decisions.get(old.uuid)
        if kept is not None and old in kept:
            kept[kept.index(old)] = new

    def forget(self, uuid: str) -> None:
        self._guests.pop(uuid, None)
        self._changed.pop(uuid, None)
        self.decisions.pop(uuid, None)


class _Round:
    """What one round has changed so far: the rate limits' counts."""

    def __init__(self) -> None:
        self.per_guest: collections.Counter[str] = collections.Counter()
        self.fields: set[tuple[str, str]] = set()
        self.changes = 0


def _assume(g: GuestView, p: Proposal) -> None:
    """``g`` as it is once ``p`` is in force."""
    if p.field == "cpu_shares":
        g.cpu_shares = p.after
    elif p.field == "vcpu_quota":
        g.cap_percent = p.after
    else:
        g.pins = {**g.pins, **p.after}


def _current(g: GuestView | None, field: str):
    if g is None:
        return None
    if field == "cpu_shares":
        return g.cpu_shares
    if field == "vcpu_quota":  # no cap in force: the top of its range, where the cap tuner starts from
        a = g.policy.adaptive
        return g.cap_percent if g.cap_percent is not None or a is None or a.cap_percent is None else a.cap_percent[1]
    if field == "vcpus":
        return dict(g.pins)
    return None


def _same(before, after) -> bool:
    try:
        return bool(before == after)
    except Exception:  # noqa: BLE001 - a plugin's odd value is compared, never trusted
        return False
