"""Names on the bus: one request queue per operation, one per agent host."""

from __future__ import annotations

from kombu import Exchange, Queue

from vmsched.messages import Op

REQUEST_QUEUES: dict[Op, str] = {
    Op.DISCOVER: "vmsched.discover",
    Op.FILTER: "vmsched.filter",
    Op.SCORE: "vmsched.score",
    Op.BALANCE: "vmsched.balance",
}

#: Topic exchange for events (agent lifecycle, applied, drift, error).
EVENTS_EXCHANGE = Exchange("vmsched.events", type="topic", durable=True)

# Which queues each scheduling service consumes is declared by the service
# itself (its QUEUES); vmsched.runner.service_queues() collects them.

#: Operation answered by every worker without touching its handler (readiness).
PING = "ping"


def agent_queue(host_id: str) -> str:
    return f"vmsched.agent.{host_id}"


def event_key(host_id: str, event: str) -> str:
    return f"agent.{host_id}.{event}"


def request_queue(name: str) -> Queue:
    """A request queue; every party declares it identically (idempotent)."""
    return Queue(name, exchange="", routing_key=name, durable=False, auto_delete=False, no_declare=False)
