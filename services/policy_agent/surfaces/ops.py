"""The agent's operations: the contract's requests (:mod:`vmsched.agent_contract`) onto the agent.

One table for the local socket and the bus; a request is validated into its
model first, so a bad one (a NUL in a guest name, an unknown field in a
policy) is refused with every reason before the agent or libvirt sees it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from pydantic import BaseModel, ValidationError

from vmsched.agent_contract import OPERATIONS, AgentOp, CheckStartRequest

from ..errors import PolicyError
from ..policy.model import describe


class Agent(Protocol):
    """What the surfaces (socket, bus) ask of the agent: its operations, nothing else."""

    def status(self) -> dict: ...
    def set_policy(self, guest: str, policy: dict) -> dict: ...
    def get_policy(self, guest: str) -> dict: ...
    def delete_policy(self, guest: str) -> dict: ...
    def list_policies(self) -> dict: ...
    def cpus(self) -> dict: ...
    def set_pool(self, pool: str | None) -> dict: ...
    def reconcile(self) -> dict: ...
    def check_start_detail(self, guest: str, xml: str | None = None) -> tuple[bool, str, list[str]]: ...
    def start_domain(self, guest: str, wait: float = 60.0) -> dict: ...
    def stop_domain(self, guest: str, wait: float = 60.0, force: bool = False) -> dict: ...
    def explain_policy(self, guest: str) -> dict: ...


def _check_start(agent: Agent, r: CheckStartRequest) -> dict:
    ok, message, missing = agent.check_start_detail(r.uuid or r.guest, r.xml)
    return {"allowed": ok, "message": message, "missing": missing}


HANDLERS: dict[AgentOp, Callable[[Agent, Any], dict]] = {
    AgentOp.PING: lambda a, r: a.status(),
    AgentOp.SET_POLICY: lambda a, r: a.set_policy(r.guest, r.policy.model_dump(mode="json", exclude_unset=True)),
    AgentOp.GET_POLICY: lambda a, r: a.get_policy(r.guest),
    AgentOp.DELETE_POLICY: lambda a, r: a.delete_policy(r.guest),
    AgentOp.LIST_POLICIES: lambda a, r: a.list_policies(),
    AgentOp.CPUS: lambda a, r: a.cpus(),
    AgentOp.SET_POOL: lambda a, r: a.set_pool(r.dedicated_pool),
    AgentOp.RECONCILE: lambda a, r: a.reconcile(),
    AgentOp.CHECK_START: _check_start,
    AgentOp.START_DOMAIN: lambda a, r: a.start_domain(r.guest, r.wait),
    AgentOp.STOP_DOMAIN: lambda a, r: a.stop_domain(r.guest, r.wait, r.force),
    AgentOp.EXPLAIN_POLICY: lambda a, r: a.explain_policy(r.guest),
}
assert set(HANDLERS) == set(OPERATIONS), "every operation of the contract has a handler"


def parse(op: str, body: Any) -> tuple[AgentOp, BaseModel]:
    """The operation and its validated request; raises PolicyError naming every problem."""
    try:
        operation = AgentOp(op)
    except ValueError:
        known = ", ".join(sorted(o.value for o in AgentOp))
        raise PolicyError(f"unknown operation {op!r}; known: {known}") from None
    if not isinstance(body, dict):
        raise PolicyError("request body must be a JSON object")
    try:
        return operation, OPERATIONS[operation].request.model_validate(body)
    except ValidationError as exc:
        raise PolicyError([describe(err, within="policy") for err in exc.errors()]) from None


def dispatch(agent: Agent, op: str, body: Any) -> dict:
    operation, request = parse(op, body)
    return HANDLERS[operation](agent, request)
