"""The agent's operations by name: one table for the local socket and the bus."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .errors import PolicyError

if TYPE_CHECKING:
    from .agent import Agent


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


def _check_start(agent: "Agent", body: dict[str, Any]) -> dict:
    guest = body.get("uuid") or _guest(body)
    ok, message, missing = agent._check_start(guest, body.get("xml"))
    return {"allowed": ok, "message": message, "reason": message, "missing": missing}


OPS: dict[str, Callable[["Agent", dict[str, Any]], dict]] = {
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


def dispatch(agent: "Agent", op: str, body: dict[str, Any]) -> dict:
    handler = OPS.get(op)
    if handler is None:
        raise PolicyError(f"unknown operation {op!r}; known: {', '.join(sorted(OPS))}")
    if not isinstance(body, dict):
        raise PolicyError("request body must be a JSON object")
    return handler(agent, body)
