"""Poison requests on RabbitMQ: which delivery runs, which gets a second chance alone, which is refused.

A request that was held by a process that died (its quorum queue's ``x-delivery-count``, or the in-flight
journal of this process's dead predecessor, :mod:`vmsched.bus.journal`) is not run among others again: it
is rejected to its dead-letter queue, whose consumers hold one request each and run it once more (a second
chance that an innocent bystander of the death survives). A second chance waits until another replica
consumes the request queue, at most :data:`HOLD_SECONDS`, so that it never kills the last replica alive. A
second chance of what this process's predecessor was handling among others is first passed on to another
replica (:data:`PASSES` times at most). A request whose second chance killed its process, that reached the
queue's delivery limit, or that the journal shows the predecessor was handling alone, is answered with an
error naming its units and never run again (docs/upgrading.md, "Poison messages").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from kombu import Producer
from kombu.message import Message

from vmsched.bus.journal import FIRST, SECOND, Journal
from vmsched.bus.topology import DEAD_EXCHANGE, is_versioned

log = logging.getLogger("vmsched.bus")

#: Header of a second chance put back by replicas whose predecessor died among several requests: who passed.
PASSED_BY = "x-vmsched-passed-by"
#: Times a replica passes the same second chance on before it runs it (no other replica took it).
PASSES = 3
#: How long a second chance waits for another replica to consume its request queue before it runs here anyway,
#: seconds: while the replica its first delivery killed is restarting, running it could kill the last one alive.
HOLD_SECONDS = 15.0
#: How often held second chances look for another replica, seconds.
HOLD_CHECK = 0.25



class Verdict(Enum):
    RUN = "run"  # among the others (the journal's FIRST)
    TO_SECOND_CHANCE = "to second chance"  # reject it to its dead-letter queue
    SECOND_CHANCE = "second chance"  # from the dead-letter queue: run it alone (the journal's SECOND)
    PASS_ON = "pass on"  # back to the dead-letter queue, for another replica
    REFUSE = "refuse"  # answer with an error naming its units; never run it again


@dataclass(frozen=True)
class Triage:
    verdict: Verdict
    why: str = ""  # REFUSE: the reason the error reply gives

    @property
    def journal_kind(self) -> bytes:
        """The in-flight journal's kind of record for a run."""
        return SECOND if self.verdict is Verdict.SECOND_CHANCE else FIRST


RUN = Triage(Verdict.RUN)


class PoisonTriage:
    """Decides, for one service process, what becomes of each delivered request (on the bus thread)."""

    def __init__(self, service: str, limit: int, journal: Journal | None) -> None:
        self.service = service
        self.limit = limit
        self.journal = journal

    @property
    def identity(self) -> str:
        return self.journal.identity if self.journal is not None else ""

    def decide(self, name: str, dead_letter: bool, message: Message) -> Triage:
        """What to do with ``message`` delivered from ``name``'s request queue (or its dead-letter queue)."""
        cid = correlation_id(message)
        blamed = self.journal.blame(cid) if self.journal is not None else None
        if blamed is not None and (blamed[1] or blamed[0] == SECOND):
            return Triage(Verdict.REFUSE, f"the previous {self.service} process on this host died handling it "
                          f"{'in its second chance' if blamed[0] == SECOND else 'alone'} and was restarted")
        headers = message.headers or {}
        if dead_letter:
            death = headers.get("x-death") or [{}]
            if message.delivery_info.get("redelivered") or int(headers.get("x-delivery-count") or 0) > 0:
                return Triage(Verdict.REFUSE,
                              f"its second chance also ended with the death of the {self.service} process holding it")
            if str(death[0].get("reason", "")) != "rejected" or self.limit < 2:
                return Triage(Verdict.REFUSE,
                              f"each of its deliveries ended with the death of the {self.service} process holding it")
            if blamed is not None and passed_by(headers).count(self.identity) < PASSES:
                return Triage(Verdict.PASS_ON)  # this process's predecessor died with it among others
            log.warning("%s: request %s on %s: second chance, alone", self.service, cid, name)
            return Triage(Verdict.SECOND_CHANCE)
        failed = int(headers.get("x-delivery-count") or 0)  # quorum queues: returned deliveries
        if is_versioned(name) and (blamed is not None or (self.limit >= 2 and failed >= self.limit - 1)):
            log.warning("%s: request %s on %s was held by a process that died (%d time(s)): given a second chance "
                        "apart from other requests", self.service, cid, name, failed)
            return Triage(Verdict.TO_SECOND_CHANCE)
        return RUN

    def pass_on(self, name: str, message: Message, producer: Producer) -> None:
        """Put a second chance back on its dead-letter queue for another replica (back here a 4th time, it runs)."""
        log.warning("%s: request %s on %s was among those the previous process on this host was handling when "
                    "it died: its second chance is left to another replica", self.service, correlation_id(message),
                    name)
        headers = message.headers or {}
        # the content type as received (kombu reads a missing one as application/data)
        producer.publish(message.body, exchange=DEAD_EXCHANGE.name, routing_key=name, retry=False,
                         headers={**headers, PASSED_BY: [*passed_by(headers), self.identity]},
                         content_type=message.content_type, content_encoding=message.content_encoding,
                         correlation_id=correlation_id(message), reply_to=message.properties.get("reply_to"))
        message.ack()


@dataclass
class HeldSecondChances:
    """Second chances waiting, on the bus thread, for another replica to consume their request queue (or for
    :data:`HOLD_SECONDS`): if a second chance kills this process too, a replica stays alive to serve the rest."""

    _held: list[tuple[float, str, Message]] = field(default_factory=list)
    _next_check: float = 0.0

    def __bool__(self) -> bool:
        return bool(self._held)

    def hold(self, name: str, message: Message) -> None:
        self._held.append((time.monotonic() + HOLD_SECONDS, name, message))
        self._next_check = 0.0

    def due(self, channel: object, others_consume: Callable[[str], bool]) -> list[tuple[str, Message]]:
        """The second chances to run now; those whose channel is gone are dropped (the broker returned them)."""
        now = time.monotonic()
        if not self._held or now < self._next_check:
            return []
        self._next_check = now + HOLD_CHECK
        held, self._held, due = self._held, [], []
        for until, name, message in held:
            if message.channel is not channel:
                continue
            if now >= until or others_consume(name):
                due.append((name, message))
            else:
                self._held.append((until, name, message))
        return due


def passed_by(headers: dict[str, Any]) -> list[str]:
    passed = headers.get(PASSED_BY)
    return [str(p) for p in passed] if isinstance(passed, (list, tuple)) else []


def correlation_id(message: Message) -> str | None:
    return message.properties.get("correlation_id")
