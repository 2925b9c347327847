"""The gateway's view of the scheduling services: discover, and one coroutine for the rest.

:meth:`Scheduler.run` runs one row of the operations table
(:mod:`vmsched.gateway.engine.operations`): it sends the typed request on the bus,
waits for the service's full outcome and turns it into a :class:`Decision`.
When the bus fails (broker down, no service answering in time) the decision is
the row's fallback, still in the engine's shape, and says why in ``errors``:
filters keep every host, scores are empty, balance is ``["", []]``.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from pydantic import BaseModel

from vmsched import metrics
from vmsched.bus import BusError
from vmsched.bus.interface import BusClient, Mark
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.gateway.limits import Limits
from vmsched.gateway.decisions.record import new_id
from vmsched.gateway.engine.operations import Operation
from vmsched.decide.rules import Decision, RenderOptions
from vmsched.messages import DiscoverReply, Op
from vmsched.whatif.format import CallRecording

log = logging.getLogger("vmsched.gateway")

#: (op, request, decision, outcomes, bus failed, seconds, call ID) -> None; must return at once (the decision log
#: queues it)
Recorder = Callable[[str, BaseModel, Decision, Any, bool, float, str], None]


class Scheduler:
    def __init__(self, bus: BusClient, request_timeout: float, limits: Limits | None = None,
                 recorder: Recorder | None = None, render: RenderOptions | None = None,
                 recording: CallRecording | None = None) -> None:
        """``recorder``: the decision log's; ``recording``: with ``--record``, where the engine's calls go."""
        self.bus = bus
        self.render = render or RenderOptions()
        self.request_timeout = request_timeout
        self.limits = limits or Limits()
        self.recorder = recorder
        self.recording = recording

    def _deadline(self, plugin_timeout: float | None) -> float:
        # A per-request plugin timeout may lengthen the wait, never past the engine's patience.
        if plugin_timeout is None:
            return self.request_timeout
        return min(max(self.request_timeout, plugin_timeout + 1.0), 110.0)

    async def discover(self) -> DiscoverReply:
        with _observed(Op.DISCOVER) as outcome:
            reply = await self.bus.call(REQUEST_QUEUES[Op.DISCOVER], Op.DISCOVER.value, {}, self.request_timeout,
                                        DiscoverReply)
            outcome.append("ok")
            return reply

    async def run(self, operation: Operation, req: BaseModel, engine: bool = False) -> tuple[Decision, Any]:
        """One scheduling operation (a row of the table): its decision and the units' outcomes.

        ``engine``: the engine's call (XML-RPC), recorded with ``--record``. Raises
        :class:`~vmsched.gateway.limits.OverLimit` for a request over the limits.
        """
        self.limits.check(req)
        call_id = new_id()  # the decision's ID, and the call's in a recording
        record = engine and self.recording is not None
        at = time.time() if record else 0.0
        started = time.perf_counter()
        decision, outcomes, bus_failed = await self._run(operation, req, (call_id, record))
        elapsed = time.perf_counter() - started
        op = operation.op.value
        if self.recorder is not None:
            self.recorder(op, req, decision, outcomes, bus_failed, elapsed, call_id)
        if record:
            self.recording.call(call_id, at, op, req, decision, outcomes, bus_failed, elapsed)  # type: ignore[union-attr]
        return decision, outcomes

    async def _run(self, operation: Operation, req: BaseModel, mark: Mark) -> tuple[Decision, Any, bool]:
        op = operation.op
        with _observed(op) as outcome:
            if operation.nothing_to_run(req):
                outcome.append("ok")
                return operation.fallback(req), operation.no_outcomes(), False
            try:
                reply = await self.bus.call(REQUEST_QUEUES[op], op.value, req.model_dump(),
                                            self._deadline(req.timeout), operation.reply, mark)  # type: ignore[attr-defined]
            except BusError as exc:  # the outcome stays "error"
                log.warning("scheduling request failed: %s", exc)
                decision = operation.fallback(req)
                decision.errors.append(f"{type(exc).__name__}: {exc}")
                return decision, operation.no_outcomes(), True
            reply = operation.complete(req, reply)
            decision = operation.decide(req, reply, self.render)
            decision.missing_facts = reply.missing_facts
            outcome.append("ok" if decision.result_code == 0 else "error")
            return decision, operation.outcomes(reply), False


@contextmanager
def _observed(op: Op) -> Iterator[list[str]]:
    """Count one gateway request; the body appends its outcome (default: error)."""
    outcome: list[str] = []
    in_flight = metrics.child(metrics.IN_FLIGHT, "gateway", op.value)
    in_flight.inc()
    started = time.perf_counter()
    try:
        yield outcome
    finally:
        in_flight.dec()
        metrics.child(metrics.REQUEST_DURATION, "gateway", op.value).observe(time.perf_counter() - started)
        metrics.child(metrics.REQUESTS, "gateway", op.value, outcome[0] if outcome else "error").inc()
