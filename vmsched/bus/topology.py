"""Names on the bus: exchanges, one request queue per operation, one per agent host.

Nothing goes through the default exchange (RabbitMQ checks write permission
on the exchange, not the queue: whoever may write to ``amq.default`` may
publish to any queue). Each kind of message has its own exchange, so broker
permissions can say who may send what (docs/deploy/broker-users.md):

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

#: Version suffix of the scheduling request queues: quorum queues with a delivery limit and dead-lettering
#: (docs/reliability.md, "Poison requests"). A queue's arguments cannot change in place (PRECONDITION_FAILED),
#: so new arguments would mean a new name.
QUEUE_VERSION = ".v2"

REQUEST_QUEUES: dict[Op, str] = {
    Op.DISCOVER: "vmsched.discover" + QUEUE_VERSION,
    Op.FILTER: "vmsched.filter" + QUEUE_VERSION,
    Op.SCORE: "vmsched.score" + QUEUE_VERSION,
    Op.BALANCE: "vmsched.balance" + QUEUE_VERSION,
}

#: How many times a request is delivered at most (each delivery whose process died counts) before
#: it is dead-lettered and answered with an error (--delivery-limit). A service process has one
#: channel (vmsched.bus.rabbitmq.worker), so one death counts one delivery; a request held by a process
#: that died is then run once more apart from other suspects (its dead-letter queue), so an
#: innocent bystander of a poisoned request's death survives with the default of 2.
DELIVERY_LIMIT = 2
#: Deliveries the broker allows at least before it dead-letters by itself (x-delivery-limit + 1).
BROKER_DELIVERIES = 3

# Exchanges are declared by whoever may (the gateway, or the broker's definitions:
# deploy/rabbitmq/setup-users.sh); the others only check that they exist (connection.ensure_exchanges).
REQUESTS_EXCHANGE = Exchange("vmsched.requests", type="topic", durable=True, no_declare=True)
AGENT_EXCHANGE = Exchange("vmsched.agent", type="topic", durable=True, no_declare=True)
REPLY_EXCHANGE = Exchange("vmsched.reply", type="direct", durable=True, no_declare=True)
#: Topic exchange for events (agent lifecycle, applied, drift, error).
EVENTS_EXCHANGE = Exchange("vmsched.events", type="topic", durable=True, no_declare=True)
#: Topic exchange for facts snapshot requests (key ``snapshot``): services ask every agent for its facts.
FACTS_EXCHANGE = Exchange("vmsched.facts", type="topic", durable=True, no_declare=True)
#: Direct exchange (key = request queue name) where a request queue puts a request past its delivery limit.
DEAD_EXCHANGE = Exchange("vmsched.dead", type="direct", durable=True, no_declare=True)
EXCHANGES = (REQUESTS_EXCHANGE, AGENT_EXCHANGE, REPLY_EXCHANGE, EVENTS_EXCHANGE, FACTS_EXCHANGE, DEAD_EXCHANGE)

# Which queues each scheduling service consumes is declared by the service
# itself (its QUEUES); vmsched.cli.runner.service_queues() collects them.

#: Operation answered by every worker without touching its handler (readiness).
PING = "ping"

_AGENT_PREFIX = "vmsched.agent."


def agent_queue(host_id: str) -> str:
    """The request queue of an agent, whose host ID must be usable as a topic key: not empty, no wildcard (a
    binding of ``#`` would receive every host's requests)."""
    if not host_id or any(c in host_id for c in "*#") or any(c.isspace() for c in host_id):
        raise ValueError(f"host ID {host_id!r} cannot be a bus routing key (empty, or has '*', '#' or a space)")
    return _AGENT_PREFIX + host_id


def event_key(host_id: str, event: str) -> str:
    return f"agent.{host_id}.{event}"


def route(queue: str) -> tuple[Exchange, str]:
    """Where a request for ``queue`` is published: its exchange and routing key."""
    if queue.startswith(_AGENT_PREFIX):
        return AGENT_EXCHANGE, queue[len(_AGENT_PREFIX):]
    return REQUESTS_EXCHANGE, queue


def request_queue(name: str, deliveries: int = DELIVERY_LIMIT) -> Queue:
    """A request queue bound to its exchange; every party declares it identically (idempotent).

    A versioned scheduling queue is a quorum queue: a request is delivered at most ``deliveries``
    times (a consumer that dies without acking counts), then goes to :func:`dead_letter_queue`.
    An agent's queue is a non-durable classic queue.
    """
    exchange, key = route(name)
    if not is_versioned(name):
        return Queue(name, exchange=exchange, routing_key=key, durable=False, auto_delete=False, no_declare=False)
    if deliveries < 1:
        raise ValueError(f"delivery limit must be at least 1, not {deliveries}")
    # the broker's limit is a backstop (the services' triage bounds the runs to ``deliveries``: vmsched.bus.rabbitmq.worker):
    # at least 2 returns allowed, so a broker node's loss, which returns what its consumers held, is not taken
    # for deaths
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": max(deliveries, BROKER_DELIVERIES) - 1,
                 "x-dead-letter-exchange": DEAD_EXCHANGE.name, "x-dead-letter-routing-key": name}
    return Queue(name, exchange=exchange, routing_key=key, durable=True, auto_delete=False, no_declare=False,
                 queue_arguments=arguments)


def dead_letter_queue(name: str) -> Queue:
    """Where the requests of ``name`` past their delivery limit wait for their service to answer them.

    A quorum queue like its request queue: a classic durable queue lives on one node, and while that node
    is down no service could declare it, so none would consume (docs/deploy/rabbitmq-cluster.md).
    """
    return Queue(name + DEAD_SUFFIX, exchange=DEAD_EXCHANGE, routing_key=name, durable=True, auto_delete=False,
                 queue_arguments={"x-queue-type": "quorum"})


#: The dead-letter queue of a request queue: its name and this suffix.
DEAD_SUFFIX = ".dlq"


def is_versioned(name: str) -> bool:
    return name.endswith(QUEUE_VERSION)


def reply_queue(name: str) -> Queue:
    """A requester's own reply queue (exclusive, gone with its connection), bound to the reply exchange."""
    return Queue(name, exchange=REPLY_EXCHANGE, routing_key=name, exclusive=True, auto_delete=True, durable=False)
