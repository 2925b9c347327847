"""The engine's XML-RPC methods: discover, runFilters, runCostFunctions, runLoadBalancing."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from pydantic import ValidationError

from vmsched.bus import BusError
from vmsched.gateway.engine import xmlrpc
from vmsched.gateway.limits import OverLimit
from vmsched.gateway.engine.operations import OPERATIONS, Operation
from vmsched.decide.rules import discover_result
from vmsched.gateway.engine.scheduler import Scheduler

log = logging.getLogger("vmsched.gateway")

Method = Callable[[Scheduler, tuple[Any, ...]], Awaitable[Any]]


async def discover(s: Scheduler, params: tuple[Any, ...]) -> Any:
    xmlrpc.arity(params, "discover", 0)
    try:
        return discover_result(await s.discover())
    except BusError as exc:
        raise xmlrpc.Fault(xmlrpc.SERVER_ERROR, f"discovery unavailable: {exc}") from None


def _operation_method(operation: Operation) -> Method:
    """The XML-RPC method of one row of the operations table."""
    name, arity, parse = operation.xmlrpc_method, operation.xmlrpc_arity, operation.from_xmlrpc

    async def method(s: Scheduler, params: tuple[Any, ...]) -> Any:
        xmlrpc.arity(params, name, arity)
        try:
            request = parse(params)
        except ValidationError as exc:
            raise xmlrpc.Fault(xmlrpc.INVALID_PARAMS, f"{name}: {invalid_params(exc)}") from None
        try:
            decision, _ = await s.run(operation, request, engine=True)
        except OverLimit as exc:
            raise xmlrpc.Fault(xmlrpc.INVALID_PARAMS, f"{name}: {exc}") from None
        return decision.envelope()

    return method


def invalid_params(exc: ValidationError) -> str:
    """Every problem of a request model, one line (input values are not repeated: they may be huge)."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg'].removeprefix('Value error, ')}" for err in exc.errors(include_input=False))


async def list_methods(s: Scheduler, params: tuple[Any, ...]) -> Any:
    return sorted(METHODS)


METHODS: dict[str, Method] = {
    "discover": discover,
    **{row.xmlrpc_method: _operation_method(row) for row in OPERATIONS.values()},
    "system.listMethods": list_methods,
}


async def handle(scheduler: Scheduler, body: bytes) -> bytes:
    """One XML-RPC call: the reply body, a result or a fault (never an HTTP error)."""
    try:
        method, params = xmlrpc.parse_call(body)
        handler = METHODS.get(method)
        if handler is None:
            raise xmlrpc.Fault(xmlrpc.METHOD_NOT_FOUND,
                               f"unknown method {xmlrpc.shown(method)}; known: {', '.join(sorted(METHODS))}")
        return xmlrpc.dump_response(await handler(scheduler, params))
    except xmlrpc.Fault as fault:
        return xmlrpc.dump_fault(fault)
    except Exception:  # noqa: BLE001 - the engine gets a fault of ours, never an exception's text
        log.exception("XML-RPC call failed")
        return xmlrpc.dump_fault(xmlrpc.Fault(xmlrpc.INTERNAL_ERROR, INTERNAL))


#: The fault of a call the gateway failed on (the cause is in its log, never sent to the engine).
INTERNAL = "internal error: the gateway could not answer this call; its log says why"
