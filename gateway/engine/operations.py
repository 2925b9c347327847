"""The gateway's three scheduling operations, one table row each.

A row says everything the gateway does for one operation, whatever the wire:
the engine's XML-RPC method and how its positional parameters become the
request model, the reply model the service answers with, the decision when
there is nothing to run or the bus fails (the fallback), how the service's
outcomes become the engine's decision, and which outcomes the JSON API shows.
:mod:`vmsched.gateway.engine.scheduler` runs a row; :mod:`vmsched.gateway.engine.calls`
(XML-RPC) and :mod:`vmsched.gateway.api` (JSON) look rows up in
:data:`OPERATIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from vmsched.gateway.engine import xmlrpc
from vmsched.decide.rules import Decision, RenderOptions, balance_decision, filter_decision, score_decision
from vmsched.words import counted
from vmsched.messages import (
    BalanceReply,
    BalanceRequest,
    FilterReply,
    FilterRequest,
    Op,
    ScoreReply,
    ScoreRequest,
)


@dataclass(frozen=True)
class Operation:
    op: Op
    xmlrpc_method: str  # the engine's method name
    xmlrpc_arity: int
    from_xmlrpc: Callable[[tuple[Any, ...]], Any]  # checked positional params -> request model
    reply: type[BaseModel]
    fallback: Callable[[Any], Decision]  # request -> the decision when nothing ran (bus failed, no units)
    decide: Callable[[Any, Any, RenderOptions], Decision]  # (request, reply, options) -> the engine's decision
    nothing_to_run: Callable[[Any], bool] = lambda req: not req.units  # request -> answer with the fallback
    outcomes: Callable[[Any], Any] = lambda reply: reply.outcomes  # reply -> the per-unit outcomes the JSON API shows
    no_outcomes: Callable[[], Any] = list  # the outcomes shown when nothing ran
    complete: Callable[[Any, Any], Any] = lambda req, reply: reply  # (request, reply) -> the reply in full


def paired_scores(req: ScoreRequest, reply: ScoreReply) -> ScoreReply:
    """The reply with every unit's aligned values paired again with the requested hosts.

    A unit's ``values`` stay beside its pairs (score_decision reads them) only when they are one per requested
    host; a unit whose values are not fails and keeps none. (Not a pydantic private attribute: that runs a Python hook for every outcome
    model.)"""
    for o in reply.outcomes:
        if o.values is None:
            continue
        if len(o.values) == len(req.hosts):
            o.scores = list(zip(req.hosts, o.values))
        else:
            o.ok, o.scores = False, []
            o.error = (f"the scoring service sent {counted(len(o.values), 'aligned score')} for "
                       f"{counted(len(req.hosts), 'host')}")
            o.values = None
    return reply


def _filter_request(params: tuple[Any, ...]) -> FilterRequest:
    return FilterRequest(
        units=xmlrpc.str_list(params[0], "filters"),
        hosts=xmlrpc.str_list(params[1], "hostIDs"),
        vm=xmlrpc.text(params[2], "vmID"),
        properties=xmlrpc.properties(params[3]),
    )


def _score_request(params: tuple[Any, ...]) -> ScoreRequest:
    return ScoreRequest.model_validate({
        "units": xmlrpc.score_units(params[0]),
        "hosts": xmlrpc.str_list(params[1], "hostIDs"),
        "vm": xmlrpc.text(params[2], "vmID"),
        "properties": xmlrpc.properties(params[3]),
    })


def _balance_request(params: tuple[Any, ...]) -> BalanceRequest:
    return BalanceRequest(
        unit=xmlrpc.text(params[0], "balancer"),
        hosts=xmlrpc.str_list(params[1], "hostIDs"),
        properties=xmlrpc.properties(params[2]),
    )


FILTER = Operation(
    op=Op.FILTER,
    xmlrpc_method="runFilters",
    xmlrpc_arity=4,
    from_xmlrpc=_filter_request,
    reply=FilterReply,
    fallback=lambda req: Decision(result=list(req.hosts)),  # a filter that cannot run keeps every host
    decide=lambda req, reply, opts: filter_decision(req.hosts, reply.outcomes),
)

SCORE = Operation(
    op=Op.SCORE,
    xmlrpc_method="runCostFunctions",
    xmlrpc_arity=4,
    from_xmlrpc=_score_request,
    reply=ScoreReply,
    fallback=lambda req: Decision(result=[]),
    decide=lambda req, reply, opts: score_decision(req.hosts, reply.outcomes, opts.score_per_unit),
    complete=paired_scores,
)

BALANCE = Operation(
    op=Op.BALANCE,
    xmlrpc_method="runLoadBalancing",
    xmlrpc_arity=3,
    from_xmlrpc=_balance_request,
    reply=BalanceReply,
    fallback=lambda req: Decision(result=["", []]),  # no VM to move
    nothing_to_run=lambda req: False,  # one unit, always named
    decide=lambda req, reply, opts: balance_decision(req.hosts, reply.outcome),
    outcomes=lambda reply: reply.outcome,
    no_outcomes=lambda: None,
)

#: The table, by operation.
OPERATIONS: dict[Op, Operation] = {row.op: row for row in (FILTER, SCORE, BALANCE)}
