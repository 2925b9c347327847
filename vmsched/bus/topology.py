"""Names on the bus: exchanges, one request queue per operation, one per agent host.

Nothing goes through the default exchange (RabbitMQ checks write permission
on the exchange, not the queue: whoever may write to ``amq.default`` may
publish to any queue). Each kind of message has its own exchange, so broker
permissions can say who may send what (docs/deploy.md, "Broker users"):

- ``vmsched.requests`` (topic, key = request queue name): scheduling requests,
  published by the gateway only;
- ``vmsched.agent`` (topic, key = host ID): requests to policy agents,
  published by the gateway only; topic permissions limit each agent's user to
  binding its own host's key;
- ``vmsched.reply`` (direct, key = reply queue name): replies, bound only to
  requesters' exclusive reply queues, so write permission on it reaches no
  request queue;
- ``vmsched.events`` (topic, key = ``agent.<host>.<event>``): agent events.
- ``vmsched.facts`` (topic, key = ``snapshot``): services asking every agent
  to publish its host facts now (the facts come back on ``vmsched.events``).

A new kind of request (e.g. services asking agents for host facts) gets its
own exchange and its own permission, never a new key on an existing one.
"""

from __future__ import annotations

from kombu import Exchange, Queue

from vmsched.messages import Op

REQUEST_QUEUES: dict[Op, str] = {
    Op.DISCOVER: "vmsched.discover",
    Op.FILTER: "vmsched.filter",
    Op.SCORE: "vmsched.score",
    Op.BALANCE: "vmsched.balance",
}

# Exchanges are declared by whoever may (the gateway, or the broker's definitions:
# deploy/rabbitmq/setup-users.sh); the others only check that they exist (connection.ensure_exchanges).
REQUESTS_EXCHANGE = Exchange("vmsched.requests", type="topic", durable=True, no_declare=True)
AGENT_EXCHANGE = Exchange("vmsched.agent", type="topic", durable=True, no_declare=True)
REPLY_EXCHANGE = Exchange("vmsched.reply", type="direct", durable=True, no_declare=True)
#: Topic exchange for events (agent lifecycle, applied, drift, error).
EVENTS_EXCHANGE = Exchange("vmsched.events", type="topic", durable=True, no_declare=True)
#: Topic exchange for facts snapshot requests (key ``snapshot``): services ask every agent for its facts.
FACTS_EXCHANGE = Exchange("vmsched.facts", type="topic", durable=True, no_declare=True)
EXCHANGES = (REQUESTS_EXCHANGE, AGENT_EXCHANGE, REPLY_EXCHANGE, EVENTS_EXCHANGE, FACTS_EXCHANGE)

#: Header of a request naming the exchange its reply goes to. A request without it comes from a
#: sender older than the exchanges (it waits on the default exchange): docs/upgrading.md.
REPLY_VIA = "x-reply-exchange"

# Which queues each scheduling service consumes is declared by the service
# itself (its QUEUES); vmsched.runner.service_queues() collects them.

#: Operation answered by every worker without touching its handler (readiness).
PING = "ping"

_AGENT_PREFIX = "vmsched.agent."


def agent_queue(host_id: str) -> str:
    return _AGENT_PREFIX + check_host_id(host_id)


def check_host_id(host_id: str) -> str:
    """A host ID usable as a topic key: not empty, no wildcard (a binding of ``#`` would receive every host's requests)."""
    if not host_id or any(c in host_id for c in "*#") or any(c.isspace() for c in host_id):
        raise ValueError(f"host ID {host_id!r} cannot be a bus routing key (empty, or has '*', '#' or a space)")
    return host_id


def event_key(host_id: str, event: str) -> str:
    return f"agent.{host_id}.{event}"


def route(queue: str) -> tuple[Exchange, str]:
    """Where a request for ``queue`` is published: its exchange and routing key."""
    if queue.startswith(_AGENT_PREFIX):
        return AGENT_EXCHANGE, queue[len(_AGENT_PREFIX):]
    return REQUESTS_EXCHANGE, queue


def request_queue(name: str) -> Queue:
    """A request queue bound to its exchange; every party declares it identically (idempotent)."""
    exchange, key = route(name)
    return Queue(name, exchange=exchange, routing_key=key, durable=False, auto_delete=False, no_declare=False)


def reply_queue(name: str) -> Queue:
    """A requester's own reply queue (exclusive, gone with its connection), bound to the reply exchange."""
    return Queue(name, exchange=REPLY_EXCHANGE, routing_key=name, exclusive=True, auto_delete=True, durable=False)
