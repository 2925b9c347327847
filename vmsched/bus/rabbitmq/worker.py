"""A service worker on RabbitMQ: consume request queues, call a handler, reply, then ack.

Connection handling, acks, deadlines, reconnects and request metrics live here once; a service
is a mapping of queue name to handler.

A worker process has ONE connection and ONE channel for all its consumers: the thread that owns
them (kombu objects are not thread-safe) moves messages, and ``consumers`` handler threads run the
handlers and hand their replies back through a pipe. When the process dies, the broker sees one
channel go and returns everything it held at once, so one death counts one delivery of each
request (with one channel per thread, a returned request could first be handed to another channel
of the same dead process and be counted twice).

Poison requests (a request that was held by a process that died) are triaged by
:mod:`vmsched.bus.rabbitmq.poison`: run, held for a second chance (decided for together, run one at a time,
alone), passed on, or refused with an error.
"""

from __future__ import annotations

import logging
import queue as queues
import time
from functools import partial
from pathlib import Path

from kombu import Connection, Consumer, Producer
from kombu.message import Message

from vmsched import metrics
from vmsched.bus import BusUnavailable
from vmsched.bus.rabbitmq.confirms import Confirms
from vmsched.bus.rabbitmq.connection import Wakeup, ensure_exchanges, publish_json, read_messages
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.journal import Journal
from vmsched.bus.rabbitmq.loop import run_reconnecting
from vmsched.bus.rabbitmq.poison import HELD_MAX, HOLD_CHECK, HeldOutcome, HeldSecondChances, PoisonTriage, Triage, Turns, \
    Verdict, correlation_id
from vmsched.bus.interface import Worker
from vmsched.bus.replies import Handler
from vmsched.bus.topology import DEAD_EXCHANGE, REPLY_EXCHANGE, dead_letter_queue, is_versioned, request_queue, \
    route

__all__ = ["Handler", "ServiceWorker"]

log = logging.getLogger("vmsched.bus")

_Item = tuple[str, Message, Triage]  # queue, message, how it runs


class ServiceWorker(Worker):
    def __init__(
        self,
        options: BusOptions,
        service: str,
        routes: dict[str, Handler],
        *,
        consumers: int = 1,
        prefetch: int = 2,
        journal_dir: Path | None = None,
    ) -> None:
        super().__init__(service, routes, consumers, options.delivery_limit)
        self.options = options
        self.prefetch = prefetch
        self.limit = options.delivery_limit
        self.journal_dir = journal_dir
        self.journal: Journal | None = None
        self.triage = PoisonTriage(service, self.limit, None)
        self.connected = False
        self._work: queues.SimpleQueue[_Item | None] = queues.SimpleQueue()
        self._done: queues.SimpleQueue[tuple[Message, bytes | None]] = queues.SimpleQueue()
        self._wakeup: Wakeup | None = None
        self._channel: object = None  # the channel of the live connection
        self._held = HeldSecondChances()  # on the bus thread
        self._turns = Turns()  # on the bus thread; a new one per connection
        # requests acknowledged once what was published for them is confirmed; a nack: a new connection
        self._acks: Confirms[Message] = Confirms(on_ack=lambda messages: [m.ack() for m in messages],
                                                 on_nack=self._nacked)
        self._refused = False  # the broker refused a reply or a copy: take a new connection

    # --- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._work, self._done = queues.SimpleQueue(), queues.SimpleQueue()
        if self.journal_dir is not None and self.journal is None:
            try:
                self.journal = Journal(self.journal_dir, self.service, self.consumers)
            except OSError as exc:
                log.warning("%s: no in-flight journal (%s): a restarted process may run again a request that "
                            "killed it, within --delivery-limit", self.service, exc)
        self.triage = PoisonTriage(self.service, self.limit, self.journal)
        self._wakeup = Wakeup()
        self._spawn(partial(run_reconnecting, self.options, self.service, self._stop, self._serve, self._reconnected),
                    f"{self.service}-bus")
        for i in range(self.consumers):
            self._spawn(lambda slot=i: self._handler_thread(slot), f"{self.service}-handler-{i}")

    def stop(self, timeout: float = 5.0) -> None:
        """Let the handlers finish what they run (their replies still go out), then close the connection."""
        handlers = [t for t in self._threads if "-handler-" in t.name]
        for _ in handlers:
            self._work.put(None)
        for t in handlers:
            t.join(timeout)
        self._stop.set()
        self._poke()
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()
        if self._wakeup is not None:
            self._wakeup.close()
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    # --- the bus thread ----------------------------------------------------
    def _nacked(self, messages: list[Message]) -> None:
        self._refused = True  # not acknowledged: delivered again on the next connection

    def _reconnected(self) -> None:
        metrics.BUS_RECONNECTS.labels(self.service).inc()
        log.info("%s: reconnected to the bus", self.service)

    def _serve(self, conn: Connection) -> None:
        ensure_exchanges(conn, {route(name)[0] for name in self.routes} | {REPLY_EXCHANGE, DEAD_EXCHANGE})
        channel = self._channel = conn.channel()  # before consuming: deliveries may come while subscribing
        self._refused = False
        self._acks.watch(channel)
        producer = Producer(channel, auto_declare=False)
        # a dead-letter queue's consumer holds several second chances, decided for together; each runs alone
        # (declared first: a quorum queue drops what it dead-letters to an exchange without a bound queue)
        self._held, self._turns = HeldSecondChances(), Turns()
        channel.basic_qos(0, HELD_MAX, False)
        for name in self.routes:
            if is_versioned(name):
                Consumer(channel, [dead_letter_queue(name)], no_ack=False,
                         on_message=partial(self._on_message, name, True, producer)).consume()
        channel.basic_qos(0, self.prefetch, False)  # RabbitMQ: per consumer, as it subscribes
        for name in self.routes:
            Consumer(channel, [request_queue(name, self.limit)], no_ack=False,
                     on_message=partial(self._on_message, name, False, producer)).consume()
        self.connected = True
        metrics.BUS_UP.labels(self.service).set(1)
        try:
            self.ready.set()
            self._pump(conn, producer, channel)
        finally:
            self.connected = False
            metrics.BUS_UP.labels(self.service).set(0)

    def _pump(self, conn: Connection, producer: Producer, channel: object) -> None:
        """Read the socket and the handlers' wake-up pipe; send what the handlers finished."""
        sock = conn.connection.sock
        beat = time.monotonic()
        while not self._stop.is_set():
            self._flush(producer, channel)
            self._release_held(channel, producer)
            wait = HOLD_CHECK if self._held else 1.0
            assert self._wakeup is not None
            if self._wakeup.wait(sock, wait):
                read_messages(conn, sock)
            if self._refused:  # its requests come back on the next connection
                raise BusUnavailable("the broker refused a reply or a second chance (publisher nack)")
            if time.monotonic() - beat >= 1.0:
                conn.heartbeat_check()
                beat = time.monotonic()
        self._flush(producer, channel)

    def _flush(self, producer: Producer, channel: object) -> None:
        """Send the replies the handlers finished, each followed by its ack."""
        while not self._done.empty():  # this thread is the only one that takes from it
            message, reply = self._done.get_nowait()
            # acknowledged once the reply is confirmed (a killed process, a lost reply: delivered again); if its
            # channel is gone the broker has returned it, and the reply may still be in time
            self._answered(message, reply, producer, channel)
            self._turns.finished(message)

    def _answered(self, message: Message, reply: bytes | None, producer: Producer, channel: object) -> None:
        """``message`` is done with: ``reply`` goes to its sender (if any, and if one waits), and ``message`` is
        acknowledged once that reply is confirmed (at once without one)."""
        reply_to = message.properties.get("reply_to")
        current = message.channel is channel
        if reply is not None and reply_to:
            publish_json(producer, reply, REPLY_EXCHANGE, reply_to,
                         correlation_id=message.properties.get("correlation_id"))
            self._acks.published(message if current else None)
        elif current:
            message.ack()

    def _poke(self) -> None:
        if self._wakeup is not None:
            self._wakeup.wake()

    # --- one message (on the bus thread) -----------------------------------
    def _on_message(self, name: str, dead_letter: bool, producer: Producer, message: Message) -> None:
        triage = self.triage.decide(name, dead_letter, message)
        verdict = triage.verdict
        if verdict is Verdict.RUN:
            self._work.put((name, message, triage))
        elif verdict is Verdict.TO_SECOND_CHANCE:
            self.triage.to_second_chance(name, message, producer)
            self._acks.published(message)
        elif verdict is Verdict.HOLD:
            self._held.hold(name, message)  # its turn comes once another replica is up (vmsched.bus.rabbitmq.poison)
            self._poke()
        elif verdict is Verdict.SECOND_CHANCE:
            if self._turns.arrived(message):
                self._work.put((name, message, triage))
            else:
                self.triage.decline_turn(name, message, producer)
                self._acks.published(message)
        elif verdict is Verdict.PASS_ON:
            self.triage.pass_on(name, message, producer)
            self._acks.published(message)
        else:
            reply = self.replier.dead(name, message.body, correlation_id(message), triage.why)
            self._answered(message, reply, producer, message.channel)

    def _release_held(self, channel: object, producer: Producer) -> None:
        """Give a held second chance whose wait is over its turn; answer those that cannot run in time
        (vmsched.bus.rabbitmq.poison)."""
        for name, message, decision in self._held.due(channel, lambda name: self._others_consume(channel, name),
                                                      self._turns.free):
            if decision is HeldOutcome.TURN:
                self.triage.give_turn(name, message, producer)
                self._acks.published(message)
                self._turns.given()
            else:  # late: an error naming its units, or nothing once its caller gave up
                why = f"its second chance could not run before its deadline (a {self.service} process holding it died)"
                reply = self.replier.dead(name, message.body, correlation_id(message), why)
                self._answered(message, reply, producer, channel)

    def _others_consume(self, channel: object, name: str) -> bool:
        """Whether a process besides this one consumes ``name``'s request queue (one channel per process)."""
        queue_name = request_queue(name, self.limit).name
        declared = channel.queue_declare(queue=queue_name, passive=True)  # type: ignore[attr-defined]
        return int(declared.consumer_count) >= 2

    # --- handler threads ---------------------------------------------------
    def _handler_thread(self, slot: int) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            name, message, triage = item
            if message.channel is not self._channel:
                continue  # its connection broke: the broker has returned it
            reply = self._answer(slot, name, message, triage)
            self._done.put((message, reply))  # None: acked unanswered rather than held until the connection closes
            self._poke()

    def _answer(self, slot: int, name: str, message: Message, triage: Triage) -> bytes | None:
        """The reply to one request, with its in-flight journal record; None if even that failed (logged): a
        handler thread must survive anything."""
        cid, journal = correlation_id(message), self.journal
        try:
            if journal is not None and cid:
                journal.begin(slot, cid, triage.journal_kind)
            try:
                return self.replier.handle(name, message.body)
            finally:
                if journal is not None and cid:
                    journal.end(slot)
        except Exception:  # noqa: BLE001 - the replier answers every handler error; this is the journal's
            log.exception("%s: request %s on %s not handled", self.service, cid, name)
            return None
