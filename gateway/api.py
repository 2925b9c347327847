"""The JSON API under /v1: everything XML-RPC cannot carry.

A malformed or over-limit request is a 400 with every reason, in the error
shape of the whole JSON API (:mod:`vmsched.gateway.strict_json`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from vmsched.bus import BusError, BusTimeout
from vmsched.gateway.agent_api import ErrorReply
from vmsched.gateway.limits import OverLimit
from vmsched.gateway.engine.operations import BALANCE, FILTER, SCORE, Operation
from vmsched.decide.rules import Decision, discover_result
from vmsched.decide.weights import finite
from vmsched.gateway.strict_json import refusal
from vmsched.messages import (
    BalanceOutcome,
    BalanceRequest,
    DiscoverReply,
    FilterOutcome,
    FilterRequest,
    MissingFacts,
    ScoreOutcome,
    ScoreRequest,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorReply, "description": "malformed request (not I-JSON, wrong types) or over a limit; "
                                              "every reason listed"},
    "4XX": {"description": "other client errors (401/403 credentials, 408 too slow, 413 body too large)"},
}
router = APIRouter(prefix="/v1", tags=["scheduling"], responses=_ERRORS)


class FilterUnitDetail(FilterOutcome):
    dropped: list[str] = Field(default_factory=list, description="requested hosts this unit removed")
    unknown: list[str] = Field(default_factory=list, description="returned IDs that were not requested")


class ScoreUnitDetail(ScoreOutcome):
    missing: list[str] = Field(default_factory=list, description="requested hosts the unit gave no (finite) score; "
                                                            "each got the unit's worst score in result")


class EngineAnswer(BaseModel):
    result_code: int = Field(description="0: every unit answered; 1: a unit failed (plugin_errors) or the request "
                                         "did (errors), which the engine writes to its audit log")
    result: Any
    plugin_errors: dict[str, list[str]]
    errors: list[str]
    missing_facts: MissingFacts | None = Field(None, description=(
        "not sent to the engine: the host facts the units that read them lacked (why hosts had none -> those "
        "hosts, and why the VM's are unknown); absent when they lacked nothing"))


class FilterAnswer(EngineAnswer):
    units: list[FilterUnitDetail]


class ScoreAnswer(EngineAnswer):
    units: list[ScoreUnitDetail]


class BalanceAnswer(EngineAnswer):
    unit: BalanceOutcome | None


class UnitsAnswer(DiscoverReply):
    engine: dict[str, dict[str, list[str]]] = Field(description="what XML-RPC discover sends the engine")


def _answer(decision: Decision) -> dict[str, Any]:
    return {**decision.envelope(), "missing_facts": decision.missing_facts}


async def _run(request: Request, operation: Operation, req: Any) -> tuple[Decision, Any]:
    try:
        return await request.app.state.scheduler.run(operation, req)
    except OverLimit as exc:
        raise HTTPException(400, refusal(str(exc), exc.problems)["detail"]) from None


@router.get("/units", response_model=UnitsAnswer, summary="Plugin units and plugin load errors (discover)")
async def units(request: Request) -> UnitsAnswer:
    try:
        reply = await request.app.state.scheduler.discover()
    except BusTimeout as exc:
        raise HTTPException(504, str(exc)) from None
    except BusError as exc:
        raise HTTPException(503, str(exc)) from None
    return UnitsAnswer(**reply.model_dump(), engine=discover_result(reply))


@router.post("/filter", response_model=FilterAnswer, summary="Run filter units (runFilters)")
async def run_filter(req: FilterRequest, request: Request) -> FilterAnswer:
    decision, outcomes = await _run(request, FILTER, req)
    requested = set(req.hosts)
    details = [
        FilterUnitDetail(
            **o.model_dump(),
            dropped=[h for h in req.hosts if h not in set(o.hosts)] if o.ok else [],
            unknown=[h for h in o.hosts if h not in requested],
        )
        for o in outcomes
    ]
    return FilterAnswer(**_answer(decision), units=details)


@router.post("/score", response_model=ScoreAnswer, summary="Run score units (runCostFunctions)")
async def run_score(req: ScoreRequest, request: Request) -> ScoreAnswer:
    decision, outcomes = await _run(request, SCORE, req)
    details = []
    for o in outcomes:
        scored = {h for h, s in o.scores if finite(s)}
        details.append(ScoreUnitDetail(**o.model_dump(), missing=[h for h in req.hosts if h not in scored] if o.ok else []))
    return ScoreAnswer(**_answer(decision), units=details)


@router.post("/balance", response_model=BalanceAnswer, summary="Run a balance unit (runLoadBalancing)")
async def run_balance(req: BalanceRequest, request: Request) -> BalanceAnswer:
    decision, outcome = await _run(request, BALANCE, req)
    return BalanceAnswer(**_answer(decision), unit=outcome)

