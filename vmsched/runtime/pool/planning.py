"""How the units of one request are laid out on plugin workers, and what each one answered.

The calls of a request become :class:`~vmsched.runtime.pool.bundle.Unit` s (their call message encoded
once: the units of a request share their arguments, encoded once too), grouped into
:class:`~vmsched.runtime.pool.bundle.Bundle` s, one per worker: cheap units travel together (one frame each
way, one wake-up of each side), a slow unit alone, so that slow units still run in parallel. What is
cheap is learnt: the mean run time of each unit, as its worker measured it.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf
from typing import Any

from vmsched.runtime.pool.bundle import Bundle, Unit
from vmsched.runtime.contract import KIND
from vmsched.facts.wire import PreparedFacts
from vmsched.runtime.protocol import ENCODER
from vmsched.runtime.types import Call, CallResult

#: The units of a request share one worker while their expected run time together stays under this
#: (seconds); a slower unit gets a worker of its own. 0: every unit alone.
BUNDLE_SECONDS = 0.002
_SCORE_METHOD = KIND["score"].method


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
