"""JSON API of the per-hypervisor policy agents: /v1/hosts/{host}/...

Each request goes over the bus to the agent queue of that host
(``vmsched.agent.<host>``). Agent refusals come back as
``"<code>: <message>"`` and map to HTTP: invalid -> 400, not_found -> 404;
an unreachable bus -> 503, no agent answering in time -> 504.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import BaseModel, Field

from vmsched.services.policy_agent.policy.errors import decode
from vmsched.services.policy_agent.policy.model import GuestPolicy
from vmsched.bus import BusTimeout, BusUnavailable, RequestError
from vmsched.bus.topology import agent_queue

router = APIRouter(prefix="/v1/hosts", tags=["policy agent"])

HOST = Path(description="host ID of the agent (its bus queue is vmsched.agent.<host>)",
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
GUEST = Path(description="guest name or UUID", min_length=1, max_length=256)
TIMEOUT = 10.0
STATUS = {"invalid": 400, "not_found": 404, "unavailable": 503}


class PoolChange(BaseModel):
    dedicated_pool: str = Field("", description="new dedicated pool in libvirt CPU-set syntax; '' or 'none' for none")


class DomainAction(BaseModel):
    wait: float = Field(60.0, ge=0, le=600, description="seconds to wait for each guest to start or stop")
    force: bool = Field(False, description="stop only: destroy a guest that does not shut down within wait")


async def _call(request: Request, host: str, op: str, body: dict[str, Any], timeout: float = TIMEOUT) -> dict:
    try:
        return await request.app.state.bus.call(agent_queue(host), op, body, timeout)
    except RequestError as exc:
        code, message = decode(str(exc))
        raise HTTPException(STATUS.get(code, 502), {"code": code, "error": message, "host": host}) from None
    except BusTimeout:
        raise HTTPException(504, {"code": "timeout", "host": host,
                                  "error": f"no answer from the agent of host {host!r} within {timeout:g} s"}) from None
    except BusUnavailable as exc:
        raise HTTPException(503, {"code": "unavailable", "host": host, "error": str(exc)}) from None


@router.get("/{host}/policies", summary="Guests with a CPU policy on a host")
async def list_policies(request: Request, host: str = HOST) -> dict:
    return await _call(request, host, "list_policies", {})


@router.get("/{host}/policies/{guest}", summary="A guest's policy, allocation, desired pins and status")
async def get_policy(request: Request, host: str = HOST, guest: str = GUEST) -> dict:
    return await _call(request, host, "get_policy", {"guest": guest})


@router.put("/{host}/policies/{guest}", summary="Set (replace) a guest's policy; refused whole when invalid")
async def set_policy(policy: GuestPolicy, request: Request, host: str = HOST, guest: str = GUEST) -> dict:
    return await _call(request, host, "set_policy", {"guest": guest, "policy": policy.to_dict()})


@router.delete("/{host}/policies/{guest}", summary="Remove a guest's policy and release its dedicated CPUs")
async def delete_policy(request: Request, host: str = HOST, guest: str = GUEST) -> dict:
    return await _call(request, host, "delete_policy", {"guest": guest})


@router.get("/{host}/cpus", summary="Host CPUs, dedicated pool, shared set and allocations")
async def cpus(request: Request, host: str = HOST) -> dict:
    return await _call(request, host, "cpus", {})


@router.put("/{host}/cpus", summary="Change the dedicated pool (re-pins affected guests; refused whole if a guest no longer fits)")
async def set_pool(change: PoolChange, request: Request, host: str = HOST) -> dict:
    return await _call(request, host, "set_pool", {"dedicated_pool": change.dedicated_pool}, timeout=60.0)


@router.post("/{host}/reconcile", summary="Run one reconcile sweep on the host now")
async def reconcile(request: Request, host: str = HOST) -> dict:
    return await _call(request, host, "reconcile", {}, timeout=60.0)


@router.post("/{host}/domains/{guest}/start", summary="Start a guest after its requirements (transitively)")
async def start_domain(request: Request, action: DomainAction | None = None, host: str = HOST,
                       guest: str = GUEST) -> dict:
    action = action or DomainAction()
    return await _call(request, host, "start_domain", {"guest": guest, "wait": action.wait},
                       timeout=TIMEOUT + action.wait)


@router.post("/{host}/domains/{guest}/stop", summary="Stop a guest after the guests that require it")
async def stop_domain(request: Request, action: DomainAction | None = None, host: str = HOST,
                      guest: str = GUEST) -> dict:
    action = action or DomainAction()
    return await _call(request, host, "stop_domain", {"guest": guest, "wait": action.wait, "force": action.force},
                       timeout=TIMEOUT + 2 * action.wait + 30)
