"""JSON API of the decision log: ``GET /v1/decisions`` and ``GET /v1/decisions/{id}`` (role ``read``).

Each record says what every unit did to every host, the result sent to the
engine, whether it was a fallback, the facts age of each host, the gateway
that answered, and a one-line summary (:mod:`vmsched.gateway.decisions.log`).
With several replicas on RabbitMQ the answering gateway asks the others for
at most 0.5 s (:mod:`vmsched.gateway.decisions.peers`); ``replicas`` says who
answered and names those that did not.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request

from vmsched.gateway.decisions.log import DecisionLog
from vmsched.gateway.decisions.record import for_reader

router = APIRouter(tags=["decision log"])

DecisionId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="a decision's ID")]


def _log(request: Request) -> DecisionLog:
    return request.app.state.decisions


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
    log = _log(request)
    found = await log.search(limit, vm=vm, host=host, op=op, errors_only=errors == "only")
    return {"decisions": [for_reader(r) for r in found.records], "count": len(found.records),
            "gateway": log.gateway, "ring_size": log.ring.size, "replicas": found.replicas(log.gateway)}


@router.get("/v1/decisions/{decision_id}", summary="One decision: every unit's verdict on every host")
async def get_decision(request: Request, decision_id: DecisionId) -> dict[str, Any]:
    log = _log(request)
    found = await log.find(decision_id)
    if not found.records:
        missing = "; ".join(f"{m['gateway']}: {m['error']}" for m in found.missing)
        raise HTTPException(404, {"code": "not_found", "error": f"no decision {decision_id} in the log of any replica "
                                  "that answered (it may have left the ring)" + (f"; no answer from {missing}"
                                                                                  if missing else ""),
                                  "replicas": found.replicas(log.gateway)})
    return for_reader(found.records[0])
