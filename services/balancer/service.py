"""Load balancing: one unit per request, its proposal checked for shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from vmsched.services.scoring.results import BadResult, host_list
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.bus.worker import Handler
from vmsched.messages import BalanceOutcome, BalanceReply, BalanceRequest, Envelope, Kind, Op
from vmsched.service import PluginService


class BalancerService(PluginService):
    name = "balancer"

    def routes(self) -> dict[str, Handler]:
        return {REQUEST_QUEUES[Op.BALANCE]: self.balance}

    def balance(self, env: Envelope) -> BaseModel:
        req = BalanceRequest.model_validate(env.body)
        (run,) = self.run_units(Kind.BALANCE, [req.unit], (req.hosts, req.properties), env.deadline, req.timeout)
        r = run.result
        outcome = BalanceOutcome(unit=req.unit, ok=r.ok, error=r.error, timed_out=r.timed_out,
                                 duration=r.duration, stderr=r.stderr)
        if r.ok:
            try:
                outcome.vm, outcome.hosts = proposal(r.value)
            except BadResult as exc:
                outcome.ok, outcome.error = False, str(exc)
        return BalanceReply(outcome=outcome)


def proposal(value: Any) -> tuple[str, list[str]]:
    """``(vm_id or None/"", [host_ids])`` -> ``(vm, hosts)``; anything else is refused."""
    if not (isinstance(value, list) and len(value) == 2):
        raise BadResult(f"balance returned {value!r:.100}, expected (vm_id, [host_ids])")
    vm, hosts = value
    if vm is None:
        vm = ""
    if not isinstance(vm, str):
        raise BadResult(f"balance returned VM {vm!r}, expected a VM ID string or None")
    return vm, host_list(hosts, "balance")
