"""JSON API of host facts: ``GET /v1/facts`` and ``GET /v1/hosts/{host}/facts`` (role ``read``).

The gateway keeps its own facts cache, fed like the services' (its own
queue on ``vmsched.events``, a snapshot request on start): docs/facts.md.
A host without an agent, or whose engine ID cannot be resolved, has no
facts: 404 with the reason.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from vmsched.facts.cache import FactsCache

from vmsched.gateway.agent_api import ErrorDetail, ErrorReply, Host


class EngineHostId(BaseModel):
    id: str = Field(description="an engine host ID (vds_id) a request may name")
    via: Literal["agent", "host map", "engine link"] = Field(
        description="agent: the agent's own host ID (the engine's when the agent runs with --host-id set to it); "
                    "host map: a line of --facts-host-map; engine link: found through the engine link")


class HostFactsView(BaseModel):
    host_id: str = Field(description="the host ID asked for")
    agent_host_id: str = Field(description="the agent's host ID it resolved to")
    stale: bool = Field(description="older than --facts-max-age (default 3 agent intervals)")
    age: float = Field(description="seconds since the agent collected these facts")
    source: str = Field(description="the agent (and its process instance) that sent them")
    engine_host_ids: list[EngineHostId] = Field(
        description="the engine host IDs that resolve to this agent (docs/facts.md, \"Host identity\")")
    time: float
    seq: int
    interval: float = Field(description="the agent's collection interval, seconds")
    version: int = Field(description="bus contract version of the agent's message")
    host: dict[str, Any] = Field(description="vmsched.facts.HostFacts (MiB, %, seconds)")
    guests: list[dict[str, Any]] = Field(description="vmsched.facts.GuestFacts of every guest")


class FactsList(BaseModel):
    hosts: list[HostFactsView]
    known: int
    stale: int


router = APIRouter(tags=["host facts"])


def _cache(request: Request) -> FactsCache:
    cache = getattr(request.app.state, "facts", None)
    if cache is None:
        detail = ErrorDetail(code="unavailable", error="this gateway keeps no facts cache (--facts is off)")
        raise HTTPException(503, detail.model_dump())
    return cache


@router.get("/v1/facts", summary="Every host's newest facts, with staleness and source", response_model=FactsList)
async def list_facts(request: Request) -> dict:
    views = _cache(request).views()
    return {"hosts": views, "known": len(views), "stale": sum(v["stale"] for v in views)}


@router.get("/v1/hosts/{host}/facts", summary="One host's newest facts", response_model=HostFactsView,
            responses={404: {"model": ErrorReply, "description": "no facts for this host (no agent, or unresolved)"}})
async def host_facts(request: Request, host: Host) -> dict:
    cache = _cache(request)
    view = cache.view(host)
    if view is None:
        raise HTTPException(404, ErrorDetail(code="not_found", error=cache.problem(host), host=host).model_dump())
    return view
