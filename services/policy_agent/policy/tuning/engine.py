"""One tuning round: samples in, decisions out.

Keeps the history (host samples, each guest's samples since its last change), runs the tuners, checks each
proposal (:mod:`.guard`), applies hysteresis and the rate limits, and remembers the last decisions per guest.
Nothing here touches libvirt: the caller applies the ``applied`` decisions.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Iterable

from .config import TunerConfig
from .guard import refusal
from .types import Decision, GuestSample, GuestView, HostSample, Proposal, TuneInput
from . import demand, elastic, hotspot

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
        self.decisions: dict[str, collections.deque[Decision]] = {}

    def observe(self, host: HostSample, guests: dict[str, GuestSample]) -> None:
        self._host.append(host)
        for uuid in list(self._guests):
            if uuid not in guests:
                del self._guests[uuid]
        for uuid, sample in guests.items():
            self._guests.setdefault(uuid, collections.deque(maxlen=self._depth)).append(sample)

    def input(self, shared: frozenset[int], guests: Iterable[GuestView]) -> TuneInput:
        views = {}
        for g in guests:
            g.samples = list(self._guests.get(g.uuid, ()))
            views[g.uuid] = g
        return TuneInput(shared, list(self._host), views)

    def step(self, inp: TuneInput, extra: Iterable[Proposal] = (), now: float | None = None) -> list[Decision]:
        """Run the tuners over ``inp`` (plus ``extra`` proposals, e.g. from plugins); return every decision:
        applied (dry_run), refused by the guard, or deferred by a rate limit (proposed again next interval)."""
        now = time.time() if now is None else now
        proposals: list[Proposal] = []
        for name, tuner in self.tuners.items():
            proposals.extend(tuner(inp, self.config))
        proposals.extend(extra)
        out: list[Decision] = []
        per_guest: collections.Counter[str] = collections.Counter()
        fields: set[tuple[str, str]] = set()
        changes = 0
        outcome_ok = "dry_run" if self.config.dry_run else "applied"
        for p in proposals:
            g = inp.guests.get(p.uuid)
            before = _current(g, p.field)
            why = refusal(p, g, inp.shared)
            if why is None and _same(before, p.after):
                continue  # nothing to change
            if why is None and (p.uuid, p.field) in fields:
                why = f"{p.field} of this guest already changed in this interval"
            if why is None and per_guest[p.uuid] >= self.config.max_guest_changes:
                why = f"rate limit: at most {self.config.max_guest_changes} change(s) per guest per interval"
            if why is None and changes >= self.config.max_changes:
                why = f"rate limit: at most {self.config.max_changes} change(s) per interval on the host"
            if why is None:
                per_guest[p.uuid] += 1
                changes += 1
                fields.add((p.uuid, p.field))
            outcome = outcome_ok if why is None else ("deferred" if why.startswith("rate limit") else "refused")
            d = Decision(now, p.uuid, g.name if g else p.uuid, p.tuner, p.field, before, p.after,
                         p.reason if why is None else f"{outcome}: {why} (proposed because: {p.reason})", outcome)
            out.append(d)
            self.decisions.setdefault(p.uuid, collections.deque(maxlen=KEEP_DECISIONS)).append(d)
            if why is None:  # hysteresis: the condition must hold again K intervals (also in dry-run: no flood)
                self._guests.pop(p.uuid, None)
                if p.field == "vcpus":  # the host's CPU use before a move no longer describes it: judge the
                    self._host.clear()  # next move on K fresh intervals (else a second guest follows the first)
        return out

    def amend(self, old: Decision, new: Decision) -> None:
        """Replace a kept decision (applying it failed: explain must say so)."""
        kept = self.decisions.get(old.uuid)
        if kept is not None and old in kept:
            kept[kept.index(old)] = new

    def forget(self, uuid: str) -> None:
        self._guests.pop(uuid, None)
        self.decisions.pop(uuid, None)


def _current(g: GuestView | None, field: str):
    if g is None:
        return None
    if field == "cpu_shares":
        return g.cpu_shares
    if field == "vcpu_quota":
        return g.cap_percent
    if field == "vcpus":
        return dict(g.pins)
    return None


def _same(before, after) -> bool:
    try:
        return bool(before == after)
    except Exception:  # noqa: BLE001 - a plugin's odd value is compared, never trusted
        return False
