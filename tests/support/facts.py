"""Playing the agents' part on the bus: facts messages published on the events exchange, as an agent sends them.

For tests whose agents cannot be real ones (a host identity or memory the test must choose) and for tests that
send malformed or forged messages. Every call opens one connection for all its messages and releases it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator, Sequence

from kombu import Producer

from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.facts.cache import FactsCache
from vmsched.facts.model import FactsMessage, GuestFacts, HostFacts, facts_key
from vmsched.plugin.facts import CALL, CallFacts


def publish_events(url: str, messages: Iterable[tuple[str, bytes | str]]) -> None:
    """Each ``(routing key, body)`` on the events exchange, in order, as JSON (the body is sent as it is)."""
    conn = open_connection(BusOptions(url=url))
    try:
        ensure_exchanges(conn, (EVENTS_EXCHANGE,))
        producer = Producer(conn.default_channel, auto_declare=False)
        for key, body in messages:
            producer.publish(body, exchange=EVENTS_EXCHANGE, routing_key=key, content_type="application/json")
    finally:
        conn.release()


def publish_facts(url: str, messages: Iterable[FactsMessage]) -> None:
    """Each facts message under its own agent's routing key (``agent.<host_id>.facts``)."""
    publish_events(url, ((facts_key(m.host_id), m.model_dump_json()) for m in messages))


def facts_message(host_id: str, seq: int, host: HostFacts, guests: Sequence[GuestFacts] = ()) -> FactsMessage:
    """A message of the agent instance ``e2e`` sent now, announcing its next one in 60 s (never stale in a test)."""
    return FactsMessage(host_id=host_id, instance="e2e", seq=seq, time=time.time(), interval=60.0,
                        guests=list(guests), host=host)


@contextlib.contextmanager
def reading(call: CallFacts | dict | None) -> Iterator[CallFacts]:
    """``vmsched.plugin.facts`` reads ``call`` (or a payload in the full form) inside the block, as a unit does
    while the plugin worker serves a call."""
    found = call if isinstance(call, CallFacts) else CallFacts(call)
    token = CALL.set(found)
    try:
        yield found
    finally:
        CALL.reset(token)


def full_form(cache: FactsCache, hosts: list[str], vm: str = "", with_guests: bool = False) -> dict:
    """A call's facts from ``cache`` in the full form (the shape of a ``vmsched plugin run --facts`` file), each
    host's fields as the pool sends them (its plugin view), to compare with what the wire form gives a worker."""
    now, found, missing = time.time(), {}, {}
    for host_id in dict.fromkeys(hosts):
        entry, resolved = cache.resolve(host_id)
        if entry is None:
            missing[host_id] = resolved
            continue
        found[host_id] = {**json.loads(entry.fragment), "agent_host_id": resolved,
                          "stale": cache.is_stale(entry, now), "age": round(cache.age(entry, now), 3)}
        if with_guests:
            found[host_id]["guests"] = [g.model_dump() for g in entry.guests]
    view, problem = cache.vm(vm)
    return {"hosts": found, "missing": missing, "vm": view, "vm_problem": problem}
