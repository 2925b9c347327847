"""The engine's XML-RPC methods: discover, runFilters, runCostFunctions, runLoadBalancing."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from vmsched.gateway import xmlrpc
from vmsched.gateway.render import discover_result
from vmsched.gateway.scheduler import Scheduler
from vmsched.bus import BusError
from vmsched.messages import BalanceRequest, FilterRequest, ScoreRequest

log = logging.getLogger("vmsched.gateway")

Method = Callable[[Scheduler, tuple[Any, ...]], Awaitable[Any]]


async def discover(s: Scheduler, params: tuple[Any, ...]) -> Any:
    xmlrpc.arity(params, "discover", 0)
    try:
        return discover_result(await s.discover())
    except BusError as exc:
        raise xmlrpc.Fault(xmlrpc.SERVER_ERROR, f"discovery unavailable: {exc}") from None


async def run_filters(s: Scheduler, params: tuple[Any, ...]) -> Any:
    xmlrpc.arity(params, "runFilters", 4)
    req = FilterRequest(
        units=xmlrpc.str_list(params[0], "filters"),
        hosts=xmlrpc.str_list(params[1], "hostIDs"),
        vm=xmlrpc.text(params[2], "vmID"),
        properties=xmlrpc.properties(params[3]),
    )
    decision, _ = await s.filter(req)
    return decision.envelope()


async def run_cost_functions(s: Scheduler, params: tuple[Any, ...]) -> Any:
    xmlrpc.arity(params, "runCostFunctions", 4)
    req = ScoreRequest.model_validate({
        "units": xmlrpc.score_units(params[0]),
        "hosts": xmlrpc.str_list(params[1], "hostIDs"),
        "vm": xmlrpc.text(params[2], "vmID"),
        "properties": xmlrpc.properties(params[3]),
    })
    decision, _ = await s.score(req)
    return decision.envelope()


async def run_load_balancing(s: Scheduler, params: tuple[Any, ...]) -> Any:
    xmlrpc.arity(params, "runLoadBalancing", 3)
    req = BalanceRequest(
        unit=xmlrpc.text(params[0], "balancer"),
        hosts=xmlrpc.str_list(params[1], "hostIDs"),
        properties=xmlrpc.properties(params[2]),
    )
    decision, _ = await s.balance(req)
    return decision.envelope()


async def list_methods(s: Scheduler, params: tuple[Any, ...]) -> Any:
    return sorted(METHODS)


METHODS: dict[str, Method] = {
    "discover": discover,
    "runFilters": run_filters,
    "runCostFunctions": run_cost_functions,
    "runLoadBalancing": run_load_balancing,
    "system.listMethods": list_methods,
}


async def handle(scheduler: Scheduler, body: bytes) -> bytes:
    """One XML-RPC call: the reply body, a result or a fault (never an HTTP error)."""
    try:
        method, params = xmlrpc.parse_call(body)
        handler = METHODS.get(method)
        if handler is None:
            raise xmlrpc.Fault(xmlrpc.METHOD_NOT_FOUND, f"unknown method {method!r}; known: {', '.join(sorted(METHODS))}")
        return xmlrpc.dump_response(await handler(scheduler, params))
    except xmlrpc.Fault as fault:
        return xmlrpc.dump_fault(fault)
    except Exception as exc:  # noqa: BLE001 - the engine gets a fault, never a stack trace page
        log.exception("XML-RPC call failed")
        return xmlrpc.dump_fault(xmlrpc.Fault(xmlrpc.INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}"))
