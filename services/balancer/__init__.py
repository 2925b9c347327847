"""Balancer service: runs load-balancing units (queue vmsched.balance.v2).

Load balancing: one unit per request, its proposal checked for shape.
"""

from __future__ import annotations

from pydantic import BaseModel

from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.messages import BalanceReply, BalanceRequest, Envelope, Kind, Op
from vmsched.runtime.contract import KIND
from vmsched.runtime.units import balance_outcome
from vmsched.service import PluginService, missing_facts

_BALANCE = KIND[Kind.BALANCE]


class BalancerService(PluginService):
    name = "balancer"
    QUEUES = {REQUEST_QUEUES[Op.BALANCE]: "balance"}
    uses_facts = True

    def balance(self, env: Envelope) -> BaseModel:
        req = BalanceRequest.model_validate(env.body)
        args = _BALANCE.args(req.hosts, "", req.properties)
        facts, shadowed = self.call_facts(env, lambda: self.facts_for(req.hosts, with_guests=True))  # a guest to move
        (run,) = self.run_units(Kind.BALANCE, [req.unit], args, env.deadline, req.timeout, facts)
        outcome = balance_outcome(run, req.hosts)
        if shadowed:
            self.shadowed(env, Kind.BALANCE, req.hosts, "", req.properties, [(req.unit, 1)], facts, [outcome])
        return BalanceReply(outcome=outcome, missing_facts=missing_facts([run], req.hosts))
