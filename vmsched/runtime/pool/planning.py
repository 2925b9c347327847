"""How the units of one request are laid out on plugin workers, and what each one answered.

The calls of a request become :class:`Unit` s (their call message encoded
once: the units of a request share their arguments, encoded once too), grouped into
:class:`Bundle` s, one per worker: cheap units travel together (one frame each
way, one wake-up of each side), a slow unit alone, so that slow units still run in parallel. What is
cheap is learnt: the mean run time of each unit, as its worker measured it.

A :class:`Bundle` (the units of one request that go to one plugin worker, as one frame each way) is what a
:class:`~vmsched.runtime.pool.batch.Batch` runs on one worker: a frame that carries one or several unit
calls (``{"op": "batch", "calls": [...]}``, :mod:`vmsched.runtime.worker.main`): one pipe write, one wake-up
of the worker, one reply frame and one wake-up of the caller, instead of one of each per unit.
Every unit keeps its own outcome (:class:`Unit`): value or error, stderr, time budget, run time. A request
that is not a unit call (analyze, warm) travels the same way, as a bundle of one.

The worker runs the units one after the other and marks on its progress page
(:class:`vmsched.runtime.protocol.Progress`) which one it started and when. The batch checks a bundle when its
current unit's budget (or the request deadline) may have run out; if it has, the worker is killed and that
unit alone times out. When a worker dies under a bundle, the unit it was running gets the error. The other
units of the bundle lost nothing but their worker: those not finished in time are run again, each alone on
another worker (a unit that had finished runs a second time: units are expected to compute an answer,
docs/plugins.md); if the request deadline has passed they fail saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import inf
from typing import Any

from vmsched.runtime.contract import KIND
from vmsched.facts.wire import PreparedFacts
from vmsched.runtime.pool.process import Worker
from vmsched.runtime.protocol import ENCODER, encode_frame_bytes
from vmsched.runtime.types import Call, CallResult

#: The units of a request share one worker while their expected run time together stays under this
#: (seconds); a slower unit gets a worker of its own. 0: every unit alone.
BUNDLE_SECONDS = 0.002
_SCORE_METHOD = KIND["score"].method


def seconds_text(value: float) -> str:
    return f"{value:.1f}" if value >= 0.1 else f"{value:.3f}"


@dataclass(eq=False)
class Unit:
    """One unit call of a request: its call message (JSON text, no closing brace) and its outcome."""

    head: str
    label: str
    budget: float
    wait_until: float
    hard_end: float
    facts: Any = None  # a vmsched.facts.wire.PreparedFacts sent in the bundle's held form, else None
    reply: dict[str, Any] | None = None
    error: str | None = None
    timed_out: bool = False
    duration: float = 0.0
    started: float = 0.0

    @property
    def done(self) -> bool:
        return self.reply is not None or self.error is not None

    def fail(self, error: str, now: float, timed_out: bool = False) -> None:
        self.error, self.timed_out = error, timed_out
        self.duration = max(0.0, now - self.started) if self.started else 0.0


class Bundle:
    """Units for one worker: one frame out, one frame back."""

    def __init__(self, units: list[Unit], wire: Any, created: float, frame_size: int) -> None:
        self.units = units
        self.wire = wire  # a vmsched.facts.wire.FactsWire (its encode/forget interface)
        self.facts = next((u.facts for u in units if u.facts is not None), None)
        self.frame_size = frame_size  # largest reply frame of one unit
        self.created = created
        self.wait_until = min(u.wait_until for u in units)  # monotonic time after which waiting for a worker ends
        self.started = 0.0  # when its frame went to a worker (0: not sent)
        self.end = inf  # when to check its running unit's budget next
        self.error: str | None = None
        self.blamed = units[0].label  # the label of what failed (the unit that overran or crashed the worker)

    def frame_for(self, worker: Worker) -> bytes:
        """The frame to send ``worker`` (a call with host facts sends each worker what it lacks)."""
        calls = ",".join(u.head + (',"held":true}' if u.facts is not None else "}") for u in self.units)
        text = '{"op":"batch","calls":[' + calls + "]"
        if self.facts is not None:
            text += ',"facts":' + self.wire.encode(worker, self.facts)
        return encode_frame_bytes((text + "}").encode())

    def begin(self, worker: Worker, now: float) -> None:
        """The frame goes to ``worker`` now: the first unit's time budget starts."""
        self.started = now
        worker.max_frame = self.frame_size * len(self.units) + 4096
        first = self.units[0]
        first.started = now
        self.end = min(now + first.budget, first.hard_end)

    def _running_unit(self, worker: Worker, now: float) -> int:
        """Index of the unit the worker is running (from its progress page); sets its start."""
        if len(self.units) == 1:
            return 0
        index, started = worker.progress.read(len(self.units), self.started, now)
        self.units[index].started = started
        return index

    def overran(self, worker: Worker, now: float) -> bool:
        """Called once ``end`` passed: fails the running unit and returns True if the worker must be killed."""
        index = self._running_unit(worker, now)
        unit = self.units[index]
        end = min(unit.started + unit.budget, unit.hard_end)
        if end > now:
            self.end = end
            return False
        error = f"timed out after {seconds_text(end - unit.started)} s"
        if unit.hard_end < unit.started + unit.budget:
            error += " (request deadline)"
        unit.fail(error, now, timed_out=True)
        self.blamed, self.error = unit.label, error
        return True

    def died(self, worker: Worker, error: str, now: float) -> None:
        """The worker died (or broke the protocol) under this bundle: its running unit fails."""
        unit = self.units[self._running_unit(worker, now)]
        unit.fail(error, now)
        self.blamed, self.error = unit.label, error

    def fail(self, error: str, now: float, timed_out: bool = False) -> None:
        self.error = error
        for unit in self.units:
            if not unit.done:
                unit.fail(error, now, timed_out)

    def leftovers(self, now: float) -> list[Bundle]:
        """After a kill or a death: the units to run again, each alone on another worker."""
        again: list[Bundle] = []
        why = f"its plugin worker was killed while running {self.blamed} ({self.error})"
        for unit in self.units:
            if unit.done:
                continue
            unit.started = 0.0
            if unit.hard_end <= now:
                unit.fail(f"not run to its end: {why}, and the request deadline has passed", now, timed_out=True)
                continue
            unit.wait_until = unit.hard_end if unit.hard_end < inf else now + unit.budget
            again.append(Bundle([unit], self.wire, now, self.frame_size))
        return again

    def accept(self, worker: Worker, reply: dict[str, Any], now: float) -> bool:
        """The worker's reply; False if it is not a reply to this frame (the worker is then killed)."""
        replies = reply.get("replies")
        if not isinstance(replies, list) or len(replies) != len(self.units) or not all(
                isinstance(r, dict) for r in replies):
            return False
        elapsed = now - self.started
        resync = False
        for unit, answer in zip(self.units, replies):
            unit.reply = answer
            spent = answer.get("t")
            unit.duration = min(max(float(spent), 0.0), elapsed) if isinstance(spent, (int, float)) else elapsed
            resync = resync or bool(answer.get("facts_resync"))
        if resync and self.facts is not None:
            self.wire.forget(worker)  # it lacked facts it was told it holds: next time it gets everything
        return True


class Planner:
    """Units and bundles for a pool's requests; the mean run time of each unit."""

    def __init__(self, wire: Any, frame_size: int) -> None:
        self.wire = wire  # the pool's vmsched.facts.wire.FactsWire
        self.frame_size = frame_size  # largest reply frame of one unit
        self._cost: dict[str, float] = {}  # unit label -> mean run time (s)

    def units(self, calls: Sequence[Call], now: float, hard_end: float, aligned: bool) -> list[Unit]:
        """The units of ``calls``; ``aligned``: score calls may answer with their numbers alone
        (contract.aligned_scores, CallResult.scores)."""
        units: list[Unit] = []
        args_json: dict[int, str] = {}  # the units of a request share their arguments: encoded once
        for call in calls:
            label = f"{call.plugin}.{call.cls}.{call.method}"
            wait_until = hard_end if hard_end < inf else now + call.timeout
            held = isinstance(call.facts, PreparedFacts)  # each worker gets the facts it lacks (vmsched.facts.wire)
            unit = Unit("", label, call.timeout, wait_until, hard_end, call.facts if held else None)
            units.append(unit)
            try:
                args = args_json.get(id(call.args))
                if args is None:
                    args = args_json[id(call.args)] = ENCODER.encode(list(call.args))
                head = ENCODER.encode({"plugin": call.plugin, "cls": call.cls, "method": call.method})[:-1]
                unit.head = f'{head},"args":{args}'
                if aligned and call.method == _SCORE_METHOD:
                    unit.head += ',"aligned":true'  # the numbers alone, when they are one per host in order
                if call.facts is not None and not held:  # host facts in full (vmsched.plugin.facts)
                    unit.head += ',"facts":' + ENCODER.encode(call.facts)
            except (TypeError, ValueError, RecursionError) as exc:
                unit.fail(f"arguments are not JSON-serializable: {exc}", now)
                continue
            if wait_until <= now:
                unit.fail("the request deadline passed before the call could start", now, timed_out=True)
        return units

    def bundles(self, units: list[Unit], now: float, bundle_seconds: float) -> list[Bundle]:
        """Units grouped for workers: together while their expected run time stays under ``bundle_seconds``."""
        bundles: list[Bundle] = []
        group: list[Unit] = []
        load = 0.0
        for unit in units:
            cost = self._cost.get(unit.label, 0.0)
            facts = next((u.facts for u in group if u.facts is not None), None)
            clash = facts is not None and unit.facts is not None and unit.facts is not facts
            if group and (load + cost > bundle_seconds or clash or bundle_seconds <= 0):
                bundles.append(Bundle(group, self.wire, now, self.frame_size))
                group, load = [], 0.0
            group.append(unit)
            load += cost
        if group:
            bundles.append(Bundle(group, self.wire, now, self.frame_size))
        return bundles

    def result(self, unit: Unit) -> CallResult:
        reply = unit.reply
        if reply is None:
            return CallResult(ok=False, error=unit.error, timed_out=unit.timed_out, duration=unit.duration)
        previous = self._cost.get(unit.label)  # a rough mean of its run time (races only blur it)
        self._cost[unit.label] = unit.duration if previous is None else previous + (unit.duration - previous) / 8
        stderr = reply.get("stderr") or ""
        if reply.get("ok"):
            return CallResult(ok=True, value=reply.get("value"), duration=unit.duration, stderr=stderr,
                              scores=reply.get("scores"))
        error = reply.get("error") or "unknown error"
        return CallResult(ok=False, error=error, duration=unit.duration, stderr=stderr)
