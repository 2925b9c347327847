"""JSON API of the per-hypervisor policy agents: /v1/hosts/{host}/...

Each request goes over the bus to the agent queue of that host
(``vmsched.agent.<host>``) as an operation of :mod:`vmsched.agent_contract`.
Errors map to HTTP by the reply's code: invalid -> 400 (also a malformed
path or body, with every problem listed), not_found -> 404, an agent that
fails or speaks a newer contract -> 502, an unreachable bus -> 503, no agent
answering in time -> 504. The detail is ``{"code", "error", "details", "host"}``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import BaseModel, Field

from vmsched.agent_contract import (
    AgentOp,
    CpuView,
    Deleted,
    GuestName,
    GuestView,
    PolicyDocument,
    PolicyExplain,
    PolicyList,
    Reconciled,
    Started,
    Stopped,
)
from vmsched.bus import BusTimeout, BusUnavailable, RequestError
from vmsched.bus.topology import agent_queue
from vmsched.messages import ErrorCode

HOST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
Host = Annotated[str, Path(description="host ID of the agent (its bus queue is vmsched.agent.<host>)",
                           pattern=HOST_PATTERN)]
Guest = Annotated[GuestName, Path(description="guest name or UUID (no control characters, at most 256)")]
TIMEOUT = 10.0
STATUS = {ErrorCode.INVALID: 400, ErrorCode.NOT_FOUND: 404, ErrorCode.UNAVAILABLE: 503}


class ErrorDetail(BaseModel):
    code: str = Field(description="invalid, not_found, unavailable, internal, unsupported_version or timeout")
    error: str = Field(description="what went wrong, in one line")
    details: list[str] = Field(default_factory=list, description="every reason of a refusal, one per item")
    host: str | None = None


class ErrorReply(BaseModel):
    detail: ErrorDetail


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorReply, "description": "refused: malformed request or invalid policy (every reason listed)"},
    404: {"model": ErrorReply, "description": "no such guest on the host"},
    502: {"model": ErrorReply, "description": "the agent failed, or speaks a newer contract version"},
    503: {"model": ErrorReply, "description": "the bus, or the agent's libvirt, is unavailable"},
    504: {"model": ErrorReply, "description": "no answer from the host's agent in time"},
    "4XX": {"description": "other client errors of the gateway (e.g. 413 body too large)"},
}
router = APIRouter(prefix="/v1/hosts", tags=["policy agent"], responses=_ERRORS)


async def _call(request: Request, host: str, op: AgentOp, body: dict[str, Any], timeout: float = TIMEOUT) -> dict:
    try:
        return await request.app.state.bus.call(agent_queue(host), op.value, body, timeout)
    except RequestError as exc:
        code = exc.code or ErrorCode.INTERNAL.value
        detail = ErrorDetail(code=code, error=str(exc), details=exc.details, host=host)
        raise HTTPException(STATUS.get(code, 502), detail.model_dump()) from None
    except BusTimeout:
        error = f"no answer from the agent of host {host!r} within {timeout:g} s"
        raise HTTPException(504, ErrorDetail(code="timeout", error=error, host=host).model_dump()) from None
    except BusUnavailable as exc:
        detail = ErrorDetail(code=ErrorCode.UNAVAILABLE.value, error=str(exc), host=host)
        raise HTTPException(503, detail.model_dump()) from None


class PoolChange(BaseModel):
    dedicated_pool: str = Field("", description="new dedicated pool in libvirt CPU-set syntax; '' or 'none' for none")


class DomainAction(BaseModel):
    wait: float = Field(60.0, ge=0, le=600, description="seconds to wait for each guest to start or stop")
    force: bool = Field(False, description="stop only: destroy a guest that does not shut down within wait")


@router.get("/{host}/policies", summary="Guests with a CPU policy on a host", response_model=None,
            responses={200: {"model": PolicyList}})
async def list_policies(request: Request, host: Host) -> dict:
    return await _call(request, host, AgentOp.LIST_POLICIES, {})


@router.get("/{host}/policies/{guest}", summary="A guest's policy, allocation, desired pins and status",
            response_model=None, responses={200: {"model": GuestView}})
async def get_policy(request: Request, host: Host, guest: Guest) -> dict:
    return await _call(request, host, AgentOp.GET_POLICY, {"guest": guest})


@router.get("/{host}/policies/{guest}/explain", response_model=None, responses={200: {"model": PolicyExplain}},
            summary="A guest's static policy, the values the agent's tuners set live, and their last decisions")
async def explain_policy(request: Request, host: Host, guest: Guest) -> dict:
    return await _call(request, host, AgentOp.EXPLAIN_POLICY, {"guest": guest})


@router.put("/{host}/policies/{guest}", summary="Set (replace) a guest's policy; refused whole when invalid",
            response_model=None, responses={200: {"model": GuestView}})
async def set_policy(policy: PolicyDocument, request: Request, host: Host, guest: Guest) -> dict:
    body = {"guest": guest, "policy": policy.model_dump(mode="json", exclude_unset=True)}
    return await _call(request, host, AgentOp.SET_POLICY, body)


@router.delete("/{host}/policies/{guest}", summary="Remove a guest's policy and release its dedicated CPUs",
               response_model=None, responses={200: {"model": Deleted}})
async def delete_policy(request: Request, host: Host, guest: Guest) -> dict:
    return await _call(request, host, AgentOp.DELETE_POLICY, {"guest": guest})


@router.get("/{host}/cpus", summary="Host CPUs, dedicated pool, shared set and allocations",
            response_model=None, responses={200: {"model": CpuView}})
async def cpus(request: Request, host: Host) -> dict:
    return await _call(request, host, AgentOp.CPUS, {})


@router.put("/{host}/cpus", response_model=None, responses={200: {"model": CpuView}},
            summary="Change the dedicated pool (re-pins affected guests; refused whole if a guest no longer fits)")
async def set_pool(change: PoolChange, request: Request, host: Host) -> dict:
    return await _call(request, host, AgentOp.SET_POOL, {"dedicated_pool": change.dedicated_pool}, timeout=60.0)


@router.post("/{host}/reconcile", summary="Run one reconcile sweep on the host now",
             response_model=None, responses={200: {"model": Reconciled}})
async def reconcile(request: Request, host: Host) -> dict:
    return await _call(request, host, AgentOp.RECONCILE, {}, timeout=60.0)


@router.post("/{host}/domains/{guest}/start", summary="Start a guest after its requirements (transitively)",
             response_model=None, responses={200: {"model": Started}})
async def start_domain(request: Request, host: Host, guest: Guest, action: DomainAction | None = None) -> dict:
    action = action or DomainAction()
    return await _call(request, host, AgentOp.START_DOMAIN, {"guest": guest, "wait": action.wait},
                       timeout=TIMEOUT + action.wait)


@router.post("/{host}/domains/{guest}/stop", summary="Stop a guest after the guests that require it",
             response_model=None, responses={200: {"model": Stopped}})
async def stop_domain(request: Request, host: Host, guest: Guest, action: DomainAction | None = None) -> dict:
    action = action or DomainAction()
    body = {"guest": guest, "wait": action.wait, "force": action.force}
    return await _call(request, host, AgentOp.STOP_DOMAIN, body, timeout=TIMEOUT + 2 * action.wait + 30)
