"""Poison requests on RabbitMQ: which delivery runs, which gets a second chance alone, which is refused.

A request that was held by a process that died (its quorum queue's ``x-delivery-count``, or the in-flight
journal of this process's dead predecessor, :mod:`vmsched.bus.rabbitmq.journal`) is not run among others again: it
is put on its dead-letter queue for a second chance (by the service itself, acknowledged once confirmed:
:mod:`vmsched.bus.rabbitmq.acks`), which an innocent bystander of the death survives.

The consumers of a dead-letter queue hold several second chances side by side (:data:`HELD_MAX`) and decide
for them together (:class:`HeldSecondChances`): a second chance waits until another replica consumes the
request queue, so that it never kills the last replica alive, at most :data:`HOLD_SECONDS` for all those of a
queue together and at most half the time left before its deadline. Then it gets its *turn*: it goes back to
the dead-letter queue marked running (header :data:`TURN`) and whoever receives the turn runs it, alone: one
turn at a time in a process (:class:`Turns`). A turn that comes back from a death is answered with an error:
its second chance killed its process. A second chance only held by a process that died is not marked: it is
decided again. One that cannot have its turn before its deadline is answered with an error naming its units.

A second chance of what this process's predecessor was handling among others is first passed on to another
replica (:data:`PASSES` times at most). A request whose second chance killed its process, that reached the
queue's delivery limit, or that the journal shows the predecessor was handling alone, is answered with an
error naming its units and never run again (docs/reliability.md, "Poison requests").
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from kombu import Producer
from kombu.message import Message

from vmsched.bus.rabbitmq.journal import FIRST, SECOND, Journal
from vmsched.bus.topology import DEAD_EXCHANGE, is_versioned

log = logging.getLogger("vmsched.bus")

#: Header of a second chance put back by replicas whose predecessor died among several requests: who passed.
PASSED_BY = "x-vmsched-passed-by"
#: Header of a request a service put on its dead-letter queue itself, for its second chance (the broker's own
#: dead-lettering from a quorum queue may drop it: vmsched.bus.rabbitmq.acks): who sent it.
SENT_BY = "x-vmsched-second-chance"
#: Header of a second chance given its turn: it runs as soon as a process receives it (the identity of the
#: process that gave it). Coming back from a death, it was running: it is refused.
TURN = "x-vmsched-turn"
#: Times a replica passes the same second chance on before it runs it (no other replica took it).
PASSES = 3
#: How long the second chances of a queue wait together for another replica to consume it before they run here
#: anyway, seconds (each at most half the time left before its deadline): while the replica their first delivery
#: killed is restarting, running one could kill the last one alive.
HOLD_SECONDS = 15.0
#: How often held second chances look for another replica, seconds.
HOLD_CHECK = 0.25
#: Second chances a dead-letter queue's consumer holds at most (its prefetch): those it decides for together.
HELD_MAX = 32
#: A second chance with less time than this left before its deadline is not run: it is answered with an error.
LAST_CALL = 1.0
#: How long a process waits for a turn it gave to come back to it before it gives the next one, seconds (the
#: broker may hand it to another replica's consumer, which runs it there).
TURN_WAIT = 2.0


class Verdict(Enum):
    RUN = "run"  # among the others (the journal's FIRST)
    TO_SECOND_CHANCE = "to second chance"  # reject it to its dead-letter queue
    HOLD = "hold"  # from the dead-letter queue: wait for its turn (HeldSecondChances)
    SECOND_CHANCE = "second chance"  # its turn: run it alone (the journal's SECOND)
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
            returned = bool(message.delivery_info.get("redelivered")) or int(headers.get("x-delivery-count") or 0) > 0
            if headers.get(TURN) is not None and returned:
                return Triage(Verdict.REFUSE,
                              f"its second chance also ended with the death of the {self.service} process holding it")
            rejected = headers.get(SENT_BY) is not None or str(death[0].get("reason", "")) == "rejected"
            if not rejected or self.limit < 2:
                return Triage(Verdict.REFUSE,
                              f"each of its deliveries ended with the death of the {self.service} process holding it")
            if blamed is not None and passed_by(headers).count(self.identity) < PASSES:
                return Triage(Verdict.PASS_ON)  # this process's predecessor died with it among others
            if headers.get(TURN) is None:
                return Triage(Verdict.HOLD)  # also when a death returned it: it was held, not run
            log.warning("%s: request %s on %s: second chance, alone", self.service, cid, name)
            return Triage(Verdict.SECOND_CHANCE)
        failed = int(headers.get("x-delivery-count") or 0)  # quorum queues: returned deliveries
        if is_versioned(name) and (blamed is not None or (self.limit >= 2 and failed >= self.limit - 1)):
            log.warning("%s: request %s on %s was held by a process that died (%d time(s)): given a second chance "
                        "apart from other requests", self.service, cid, name, failed)
            return Triage(Verdict.TO_SECOND_CHANCE)
        return RUN

    def to_second_chance(self, name: str, message: Message, producer: Producer) -> None:
        """Put a request on its dead-letter queue for its second chance (acknowledge it once confirmed)."""
        _again(name, message, producer, {**(message.headers or {}), SENT_BY: self.identity or self.service})

    def pass_on(self, name: str, message: Message, producer: Producer) -> None:
        """Put a second chance back on its dead-letter queue for another replica (back here a 4th time, it runs)."""
        log.warning("%s: request %s on %s was among those the previous process on this host was handling when "
                    "it died: its second chance is left to another replica", self.service, correlation_id(message),
                    name)
        headers = message.headers or {}
        _again(name, message, producer, {**headers, PASSED_BY: [*passed_by(headers), self.identity]})

    def give_turn(self, name: str, message: Message, producer: Producer) -> None:
        """Put a held second chance back on its dead-letter queue marked running: whoever receives it runs it."""
        _again(name, message, producer, {**(message.headers or {}), TURN: self.identity or self.service})

    def decline_turn(self, name: str, message: Message, producer: Producer) -> None:
        """A turn received while another second chance runs here: back to its dead-letter queue unmarked, held
        again (if the one running killed this process, a turn held here would come back as if it had run)."""
        log.info("%s: request %s on %s: turn declined, another second chance runs here", self.service,
                 correlation_id(message), name)
        _again(name, message, producer, {k: v for k, v in (message.headers or {}).items() if k != TURN})


def _again(name: str, message: Message, producer: Producer, headers: dict[str, Any]) -> None:
    """Publish ``message`` again on ``name``'s dead-letter queue with ``headers``; the caller acknowledges the
    delivery once the copy is confirmed (vmsched.bus.rabbitmq.acks: a death between the two leaves two copies, never
    none). The copy is a new message: the broker's count of its returns starts again."""
    headers = {key: value for key, value in headers.items() if key != "x-delivery-count"}
    # the content type as received (kombu reads a missing one as application/data)
    producer.publish(message.body, exchange=DEAD_EXCHANGE.name, routing_key=name, retry=False, headers=headers,
                     content_type=message.content_type, content_encoding=message.content_encoding,
                     correlation_id=correlation_id(message), reply_to=message.properties.get("reply_to"))


class HeldOutcome(Enum):
    TURN = "turn"  # give it its turn (TURN)
    LATE = "late"  # too little time left to run it: answer with an error naming its units (none once expired)


@dataclass
class _Held:
    name: str
    message: Message
    until: float  # time.monotonic() after which it runs here even if no other replica consumes
    deadline: float  # time.time(): its caller's


@dataclass
class HeldSecondChances:
    """Second chances held on the bus thread, decided for together: each waits for another replica to consume
    its request queue (if its second chance kills this process too, a replica stays alive to serve the rest), at
    most until its queue's wait ends (:data:`HOLD_SECONDS` from the first second chance of a queue that found no
    other replica: a replica killed for good makes the first one wait, not each one in turn) and at most half the
    time left before its deadline. Those that can no longer run before their deadline are answered instead."""

    check: float = HOLD_CHECK  # seconds between two looks for another replica
    _held: list[_Held] = field(default_factory=list)
    _queue_until: dict[str, float] = field(default_factory=dict)  # queue -> end of its wait (monotonic)
    _next_check: float = 0.0

    def __bool__(self) -> bool:
        return bool(self._held)

    def hold(self, name: str, message: Message) -> None:
        now, deadline = time.monotonic(), request_deadline(message)
        queue_until = self._queue_until.get(name)
        if queue_until is None or now > queue_until + HOLD_SECONDS:  # none, or long ago: a wait of its own
            queue_until = self._queue_until[name] = now + HOLD_SECONDS
        until = min(queue_until, now + max(0.0, deadline - time.time()) / 2)
        self._held.append(_Held(name, message, until, deadline))
        self._next_check = 0.0

    def due(self, channel: object, others_consume: Callable[[str], bool],
            turn_free: bool) -> list[tuple[str, Message, HeldOutcome]]:
        """What to do now with held second chances: at most one turn (when ``turn_free``: the one with the
        nearest deadline among those whose wait is over), and the late ones. Those whose channel is gone are
        dropped (the broker returned them)."""
        now, wall = time.monotonic(), time.time()
        if not self._held or now < self._next_check:
            return []
        self._next_check = now + self.check
        decided: list[tuple[str, Message, HeldOutcome]] = []
        ready: list[_Held] = []
        consumed: dict[str, bool] = {}
        kept: list[_Held] = []
        for held in self._held:
            if held.message.channel is not channel:
                continue
            if held.deadline - wall < LAST_CALL:
                decided.append((held.name, held.message, HeldOutcome.LATE))
            else:
                kept.append(held)
                if turn_free and (now >= held.until or _consumed(consumed, held.name, others_consume)):
                    ready.append(held)
        if ready:
            first = min(ready, key=lambda held: held.deadline)
            kept.remove(first)
            decided.append((first.name, first.message, HeldOutcome.TURN))
        for name, other in consumed.items():
            if other:
                self._queue_until.pop(name, None)  # another replica is there: the next one waits again if it goes
        self._held = kept
        return decided


def _consumed(seen: dict[str, bool], name: str, others_consume: Callable[[str], bool]) -> bool:
    if name not in seen:
        seen[name] = others_consume(name)
    return seen[name]


@dataclass
class Turns:
    """The turns of second chances in one process (on the bus thread): one runs at a time, and this process
    gives the next one only when none runs here and its last one had time to come back."""

    running: Message | None = None
    given_at: float | None = None  # time.monotonic() this process gave a turn that has not come back here

    @property
    def free(self) -> bool:
        return self.running is None and (self.given_at is None or time.monotonic() - self.given_at > TURN_WAIT)

    def given(self) -> None:
        self.given_at = time.monotonic()

    def arrived(self, message: Message) -> bool:
        """A turn received: whether it runs now (else another runs here: it is declined, see
        :meth:`PoisonTriage.decline_turn`, rather than held behind one that could kill this process)."""
        self.given_at = None
        if self.running is not None:
            return False
        self.running = message
        return True

    def finished(self, message: Message) -> None:
        if message is self.running:
            self.running = None


def request_deadline(message: Message) -> float:
    """The deadline a request's envelope carries (now, if it has none it can read)."""
    try:
        deadline = json.loads(message.body).get("deadline")
    except (ValueError, TypeError, AttributeError):
        deadline = None
    return float(deadline) if isinstance(deadline, (int, float)) else time.time()


def passed_by(headers: dict[str, Any]) -> list[str]:
    passed = headers.get(PASSED_BY)
    return [str(p) for p in passed] if isinstance(passed, (list, tuple)) else []


def correlation_id(message: Message) -> str | None:
    return message.properties.get("correlation_id")
