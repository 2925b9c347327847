"""The agent's operations by name: one table for the local socket and the bus."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..policy.errors import PolicyError


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


def _guest(body: dict[str, Any]) -> str:
    guest = body.get("guest") or body.get("uuid")
    if not guest or not isinstance(guest, str):
        raise PolicyError("request needs a 'guest' (name or UUID)")
    return guest


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise PolicyError(f"{key!r} must be a number of seconds, got {value!r}") from None
    if value < 0:
        raise PolicyError(f"{key!r} must not be negative")
    return value


def _check_start(agent: Agent, body: dict[str, Any]) -> dict:
    guest = body.get("uuid") or _guest(body)
    ok, message, missing = agent.check_start_detail(guest, body.get("xml"))
    return {"allowed": ok, "message": message, "reason": message, "missing": missing}


OPS: dict[str, Callable[[Agent, dict[str, Any]], dict]] = {
    "ping": lambda a, b: a.status(),
    "set_policy": lambda a, b: a.set_policy(_guest(b), b.get("policy") or {}),
    "get_policy": lambda a, b: a.get_policy(_guest(b)),
    "delete_policy": lambda a, b: a.delete_policy(_guest(b)),
    "list_policies": lambda a, b: a.list_policies(),
    "cpus": lambda a, b: a.cpus(),
    "set_pool": lambda a, b: a.set_pool(b.get("dedicated_pool")),
    "reconcile": lambda a, b: a.reconcile(),
    "check_start": _check_start,
    "start_domain": lambda a, b: a.start_domain(_guest(b), _number(b, "wait", 60.0)),
    "stop_domain": lambda a, b: a.stop_domain(_guest(b), _number(b, "wait", 60.0), bool(b.get("force", False))),
}


def dispatch(agent: Agent, op: str, body: dict[str, Any]) -> dict:
    handler = OPS.get(op)
    if handler is None:
        raise PolicyError(f"unknown operation {op!r}; known: {', '.join(sorted(OPS))}")
    if not isinstance(body, dict):
        raise PolicyError("request body must be a JSON object")
    return handler(agent, body)
