"""The gateway's view of the scheduling services: one coroutine per operation.

Each sends a typed request on the bus, waits for the service's full outcome
and turns it into a :class:`Decision`. When the bus fails (broker down, no
service answering in time) the decision still has the engine's shape and says
why in ``errors``: filters keep every host, scores are empty, balance is
``["", []]``.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

from vmsched.gateway.render import Decision, balance_decision, filter_decision, score_decision
from vmsched import metrics
from vmsched.bus import BusError
from vmsched.bus.client import AsyncBusClient
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.messages import (
    BalanceOutcome,
    BalanceReply,
    BalanceRequest,
    DiscoverReply,
    FilterOutcome,
    FilterReply,
    FilterRequest,
    Op,
    ScoreOutcome,
    ScoreReply,
    ScoreRequest,
)

log = logging.getLogger("vmsched.gateway")


class Scheduler:
    def __init__(self, bus: AsyncBusClient, request_timeout: float) -> None:
        self.bus = bus
        self.request_timeout = request_timeout

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

    async def filter(self, req: FilterRequest) -> tuple[Decision, list[FilterOutcome]]:
        with _observed(Op.FILTER) as outcome:
            if not req.units:
                outcome.append("ok")
                return Decision(result=list(req.hosts)), []
            try:
                reply = await self.bus.call(REQUEST_QUEUES[Op.FILTER], Op.FILTER.value, req.model_dump(),
                                            self._deadline(req.timeout), FilterReply)
            except BusError as exc:
                return _failed(Decision(result=list(req.hosts)), exc, outcome), []
            outcomes = reply.outcomes
            decision = filter_decision(req.hosts, outcomes)
            outcome.append("ok" if decision.result_code == 0 else "error")
            return decision, outcomes

    async def score(self, req: ScoreRequest) -> tuple[Decision, list[ScoreOutcome]]:
        with _observed(Op.SCORE) as outcome:
            if not req.units:
                outcome.append("ok")
                return Decision(result=[]), []
            try:
                reply = await self.bus.call(REQUEST_QUEUES[Op.SCORE], Op.SCORE.value, req.model_dump(),
                                            self._deadline(req.timeout), ScoreReply)
            except BusError as exc:
                return _failed(Decision(result=[]), exc, outcome), []
            outcomes = reply.outcomes
            decision = score_decision(req.hosts, outcomes)
            outcome.append("ok" if decision.result_code == 0 else "error")
            return decision, outcomes

    async def balance(self, req: BalanceRequest) -> tuple[Decision, BalanceOutcome | None]:
        with _observed(Op.BALANCE) as outcome:
            try:
                reply = await self.bus.call(REQUEST_QUEUES[Op.BALANCE], Op.BALANCE.value, req.model_dump(),
                                            self._deadline(req.timeout), BalanceReply)
            except BusError as exc:
                return _failed(Decision(result=["", []]), exc, outcome), None
            result = reply.outcome
            decision = balance_decision(req.hosts, result)
            outcome.append("ok" if decision.result_code == 0 else "error")
            return decision, result


def _failed(decision: Decision, exc: BusError, outcome: list[str]) -> Decision:
    log.warning("scheduling request failed: %s", exc)
    decision.errors.append(f"{type(exc).__name__}: {exc}")
    outcome.append("error")
    return decision


@contextmanager
def _observed(op: Op) -> Iterator[list[str]]:
    """Count one gateway request; the body appends its outcome (default: error)."""
    outcome: list[str] = []
    in_flight = metrics.IN_FLIGHT.labels("gateway", op.value)
    in_flight.inc()
    started = time.perf_counter()
    try:
        yield outcome
    finally:
        in_flight.dec()
        metrics.REQUEST_DURATION.labels("gateway", op.value).observe(time.perf_counter() - started)
        metrics.REQUESTS.labels("gateway", op.value, outcome[0] if outcome else "error").inc()
