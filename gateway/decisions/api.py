"""JSON API of the decision log: ``GET /v1/decisions`` and ``GET /v1/decisions/{id}``, and of the shadow
comparisons kept beside it: ``GET /v1/shadow`` and ``GET /v1/shadow/{id}`` (role ``read``).

Each record says what every unit did to every host, the result sent to the
engine, whether it was a fallback, the facts age of each host, the gateway
that answered, and a one-line summary (:mod:`vmsched.gateway.decisions.log`).
With several replicas on RabbitMQ the answering gateway asks the others for
at most 0.5 s (:mod:`vmsched.gateway.decisions.peers`); ``replicas`` says who
answered and names those that did not. A decision read by ID carries ``shadow``: the comparison of a shadow
candidate's run of the same call (:mod:`vmsched.gateway.decisions.shadow`), or null when this gateway has none.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request
from pydantic import BaseModel, Field

from vmsched.gateway.decisions.log import DecisionLog
from vmsched.gateway.decisions.record import for_reader
from vmsched.gateway.decisions.shadow import KEEP, ShadowStore
from vmsched.messages import ShadowComparison, ShadowStatus

router = APIRouter(tags=["decision log"])

DecisionId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="a decision's ID")]


ShadowId = Annotated[str, Path(pattern=r"^[0-9A-Za-z_.:-]{1,64}$", description="a comparison's ID: its call's, "
                                                                               "the decision's ID")]


@router.get("/v1/decisions", summary="Recent scheduling decisions, newest first, of every gateway replica")
async def list_decisions(
    request: Request,
    vm: Annotated[str | None, Query(max_length=256, description="the VM asked about (or proposed)")] = None,
    host: Annotated[str | None, Query(max_length=256, description="a host the engine offered")] = None,
    op: Annotated[Literal["filter", "score", "balance"] | None, Query()] = None,
    errors: Annotated[Literal["only"] | None, Query(description="'only': decisions with an error, "
                                                                "failed unit or fallback")] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 100,
) -> dict[str, Any]:
    log: DecisionLog = request.app.state.decisions
    found = await log.search(limit, vm=vm, host=host, op=op, errors_only=errors == "only")
    return {"decisions": [for_reader(r) for r in found.records], "count": len(found.records),
            "gateway": log.gateway, "ring_size": log.ring.size, "replicas": found.replicas(log.gateway)}


@router.get("/v1/decisions/{decision_id}", summary="One decision: every unit's verdict on every host")
async def get_decision(request: Request, decision_id: DecisionId) -> dict[str, Any]:
    log: DecisionLog = request.app.state.decisions
    found = await log.find(decision_id)
    if not found.records:
        missing = "; ".join(f"{m['gateway']}: {m['error']}" for m in found.missing)
        raise HTTPException(404, {"code": "not_found", "error": f"no decision {decision_id} in the log of any replica "
                                  "that answered (it may have left the ring)" + (f"; no answer from {missing}"
                                                                                  if missing else ""),
                                  "replicas": found.replicas(log.gateway)})
    record = for_reader(found.records[0])
    comparison = request.app.state.shadow.get(decision_id)
    return {**record, "shadow": comparison.model_dump(mode="json") if comparison is not None else None}


class ShadowList(BaseModel):
    comparisons: list[ShadowComparison] = Field(description="newest first, those matching the filters")
    count: int = Field(description="comparisons in this answer")
    counts: dict[str, int] = Field(description="every comparison this gateway keeps, by status: same, changed, "
                                               "unknown, error")
    size: int = Field(description="comparisons a gateway keeps at most (the oldest leave)")
    received: int = Field(description="comparisons received since this gateway started")
    invalid: int = Field(description="messages on the shadow keys refused since this gateway started (logged)")


@router.get("/v1/shadow", response_model=ShadowList, tags=["shadow"],
            summary="Recent shadow comparisons, newest first: a candidate's decisions beside the live ones")
async def list_shadow(
    request: Request,
    status: Annotated[ShadowStatus | None, Query(description="same, changed, unknown or error")] = None,
    op: Annotated[Literal["filter", "score", "balance"] | None, Query()] = None,
    vm: Annotated[str | None, Query(max_length=512, description="the VM of the call")] = None,
    limit: Annotated[int, Query(ge=1, le=KEEP)] = 100,
) -> ShadowList:
    store: ShadowStore = request.app.state.shadow
    listed = store.recent(limit, statuses=(status,) if status else None, op=op, vm=vm or None)
    return ShadowList(comparisons=listed, count=len(listed), counts=store.counts(),
                      size=store.size, received=store.received, invalid=store.invalid)


@router.get("/v1/shadow/{comparison_id}", response_model=ShadowComparison, tags=["shadow"],
            summary="One shadow comparison, by its call's ID (the decision's)")
async def get_shadow(request: Request, comparison_id: ShadowId) -> ShadowComparison:
    comparison = request.app.state.shadow.get(comparison_id)
    if comparison is None:
        raise HTTPException(404, {"code": "not_found", "error": f"no shadow comparison {comparison_id} on this "
                                  "gateway: no candidate ran that call, or it has left the store (the newest "
                                  f"{KEEP} are kept)"})
    return comparison
