"""A service worker: consume request queues, call a handler, reply, then ack.

Connection handling, acks, deadlines, reconnects and request metrics live here once; a service
is a mapping of queue name to handler.

On RabbitMQ a worker process has ONE connection and ONE channel for all its consumers: the
thread that owns them (kombu objects are not thread-safe) moves messages, and ``consumers``
handler threads run the handlers and hand their replies back through a pipe. When the process
dies, the broker sees one channel go and returns everything it held at once, so one death counts
one delivery of each request (with one channel per thread, a returned request could first be
handed to another channel of the same dead process and be counted twice).

Poison messages (docs/upgrading.md): a request that was held by a process that died (its
quorum queue's ``x-delivery-count``) is not run among others again: it is rejected to its
dead-letter queue, whose consumers hold one request each and run it once more (a second chance
that an innocent bystander of the death survives; it waits, within HOLD_SECONDS, until another
replica consumes the request queue, so that it never kills the last replica alive); a request whose second chance killed its
process, that reached the queue's delivery limit, or that the in-flight journal
(:mod:`vmsched.bus.journal`) shows this process's dead predecessor was handling alone, is
answered with an error naming its units and never run again.

The embedded bus (``memory://``) keeps one connection per handler thread, handling inline; a worker of
scheduling queues takes its requests from an inbox there instead (:mod:`vmsched.bus.local`).
"""

from __future__ import annotations

import logging
import os
import queue as queues
import select
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from kombu import Connection, Consumer, Producer
from kombu.message import Message

from vmsched import metrics
from vmsched.bus.connection import BusOptions, ensure_exchanges
from vmsched.bus.cork import corked
from vmsched.bus.journal import FIRST, SECOND, Journal
from vmsched.bus.local import LANES, Inbox, Request, carries, serve
from vmsched.bus.loop import run_reconnecting
from vmsched.bus.publish import Publisher
from vmsched.bus.reads import buffer_reads, nonblocking
from vmsched.bus.replies import Handler, Replier
from vmsched.bus.topology import DEAD_EXCHANGE, REPLY_EXCHANGE, REPLY_VIA, dead_letter_queue, is_versioned, \
    request_queue, route

__all__ = ["Handler", "ServiceWorker"]

log = logging.getLogger("vmsched.bus")

_Item = tuple[str, Message, bytes]  # queue, message, journal kind
_PASS = b"pass"  # triage: leave the second chance to another replica
#: Header of a second chance put back by replicas whose predecessor died among several requests: who passed.
PASSED_BY = "x-vmsched-passed-by"
_PASSES = 3  # times a replica passes the same second chance on before it runs it (no other replica took it)
#: How long a second chance waits for another replica to consume its request queue before it runs here anyway,
#: seconds: while the replica its first delivery killed is restarting, running it could kill the last one alive.
HOLD_SECONDS = 15.0
_HOLD_CHECK = 0.25  # how often held second chances look for another replica, seconds
_READ_TIMEOUT = 0.05  # the bus thread's wait for the rest of a message it has begun to read, seconds


class ServiceWorker:
    def __init__(
        self,
        url: str | BusOptions,
        service: str,
        queue: str | None = None,
        handler: Handler | None = None,
        *,
        routes: dict[str, Handler] | None = None,
        consumers: int = 1,
        prefetch: int = 2,
        journal_dir: Path | None = None,
    ) -> None:
        self.options = url if isinstance(url, BusOptions) else BusOptions(url=url)
        self.service = service
        self.routes: dict[str, Handler] = dict(routes or {})
        if queue is not None and handler is not None:
            self.routes[queue] = handler
        if not self.routes:
            raise ValueError("a worker needs at least one queue and handler")
        self.consumers = consumers
        self.prefetch = prefetch
        self.limit = self.options.delivery_limit
        self.replier = Replier(service, self.routes, self.limit)
        self.journal_dir = journal_dir
        self.journal: Journal | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._connected = 0
        self._lock = threading.Lock()
        self._work: queues.SimpleQueue[_Item | None] = queues.SimpleQueue()
        self._done: queues.SimpleQueue[tuple[Message, bytes | None]] = queues.SimpleQueue()
        self._wake: tuple[int, int] = (-1, -1)
        self._channel: object = None  # the channel of the live connection (pumped mode)
        self._inbox: Inbox | None = None  # embedded bus, scheduling queues: where the requests come (vmsched.bus.local)
        self._held: list[tuple[float, str, Message]] = []  # second chances waiting for another replica (bus thread)
        self._next_check = 0.0
        self.ready = threading.Event()  # set once every consumer has subscribed at least once

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
        if self.options.embedded and carries(self.routes):
            inbox = self._inbox = LANES.bind(self.routes)
            for i in range(self.consumers):
                self._spawn(lambda slot=i: self._serve_inbox(slot, inbox), f"{self.service}-consumer-{i}")
            return
        if self.options.embedded:
            for i in range(self.consumers):
                self._spawn(lambda slot=i: self._run(slot), f"{self.service}-consumer-{i}")
            return
        self._wake = os.pipe()
        os.set_blocking(self._wake[1], False)
        self._spawn(self._run, f"{self.service}-bus")
        for i in range(self.consumers):
            self._spawn(lambda slot=i: self._handle_loop(slot), f"{self.service}-handler-{i}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Let the handlers finish what they run (their replies still go out), then close the connection."""
        handlers = [t for t in self._threads if "-handler-" in t.name]
        for _ in handlers:
            self._work.put(None)
        for t in handlers:
            t.join(timeout)
        self._stop.set()
        self._poke()
        if self._inbox is not None:
            for _ in self._threads:
                self._inbox.put(None)  # wakes a thread waiting for a request
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()
        if self._inbox is not None:
            LANES.release(self._inbox)  # what still waits in it, waits for the next worker
            self._inbox = None
        for fd in self._wake:
            if fd >= 0:
                os.close(fd)
        self._wake = (-1, -1)
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    @property
    def connected(self) -> bool:
        return self._connected > 0

    # --- the embedded bus's inbox (scheduling queues) -----------------------
    def _serve_inbox(self, slot: int, inbox: Inbox) -> None:
        """Answer the requests put in ``inbox`` (vmsched.bus.local) on this thread, as the embedded bus's
        consumers answer theirs: no triage (in one process nothing is redelivered) and nothing to acknowledge."""
        self._set_connected(+1)
        self.ready.set()
        try:
            serve(inbox, self._stop, lambda request: self._answer(slot, request))
        finally:
            self._set_connected(-1)

    def _answer(self, slot: int, request: Request) -> bytes | None:
        return self._handled(slot, request.queue, request.body, request.cid, FIRST)

    # --- the bus thread ----------------------------------------------------
    def _run(self, slot: int | None = None) -> None:
        run_reconnecting(self.options.without_confirms(), self.service, self._stop,
                         lambda conn: self._serve(conn, slot), self._reconnected)

    def _reconnected(self) -> None:
        metrics.BUS_RECONNECTS.labels(self.service).inc()
        log.info("%s: reconnected to the bus", self.service)

    def _serve(self, conn: Connection, slot: int | None) -> None:
        ensure_exchanges(conn, {route(name)[0].name: route(name)[0] for name in self.routes}.values())
        ensure_exchanges(conn, (REPLY_EXCHANGE, DEAD_EXCHANGE))
        channel = self._channel = conn.channel()  # before consuming: deliveries may come while subscribing
        producer = Publisher(Producer(channel, auto_declare=False))  # replies: vmsched.bus.publish
        # a dead-letter queue's consumer holds one request: a second chance runs apart from other suspects
        # (declared first: a quorum queue drops what it dead-letters to an exchange without a bound queue)
        channel.basic_qos(0, 1, False)
        for name in self.routes:
            if is_versioned(name):
                Consumer(channel, [dead_letter_queue(name)], no_ack=False,
                         on_message=self._callback(name, True, producer, slot)).consume()
        channel.basic_qos(0, self.prefetch, False)  # RabbitMQ: per consumer, as it subscribes
        for name in self.routes:
            Consumer(channel, [request_queue(name, self.limit)], no_ack=False,
                     on_message=self._callback(name, False, producer, slot)).consume()
        self._set_connected(+1)
        try:
            self.ready.set()
            if slot is None:
                self._pump(conn, producer, channel)
            else:
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=1.0)
                    except socket.timeout:
                        conn.heartbeat_check()
        finally:
            self._set_connected(-1)

    def _pump(self, conn: Connection, producer: Publisher, channel: object) -> None:
        """Read the socket and the handlers' wake-up pipe; send what the handlers finished."""
        sock = conn.connection.sock
        buffered = buffer_reads(conn.connection.transport)  # bytes received that a select cannot see
        beat = time.monotonic()
        while not self._stop.is_set():
            self._flush(producer, channel)
            self._release_held(channel)
            wait = _HOLD_CHECK if self._held else 1.0
            readable = [sock] if buffered() else select.select([sock, self._wake[0]], [], [], wait)[0]
            if self._wake[0] in readable:
                os.read(self._wake[0], 4096)
            if sock in readable:
                try:  # the socket's timeout set once for the message's three frames (vmsched.bus.reads)
                    with nonblocking(conn.connection.transport, _READ_TIMEOUT):
                        conn.drain_events(timeout=_READ_TIMEOUT)  # one complete message; a partial frame is kept
                except socket.timeout:
                    pass
            if time.monotonic() - beat >= 1.0:
                conn.heartbeat_check()
                beat = time.monotonic()
        self._flush(producer, channel)

    def _flush(self, producer: Publisher, channel: object) -> None:
        """Send the replies the handlers finished, each followed by its ack, in one socket write."""
        if self._done.empty():
            return
        with corked(channel):
            while True:
                try:
                    message, reply = self._done.get_nowait()
                except queues.Empty:
                    return
                self._send(message, reply, producer)
                if message.channel is channel:
                    message.ack()  # only after the reply is out: a killed process means redelivery
                # else: its channel is gone and the broker has returned it; the reply may still be in time

    def _poke(self) -> None:
        if self._wake[1] >= 0:
            try:
                os.write(self._wake[1], b"\0")
            except BlockingIOError:
                pass  # a wake-up is already pending

    def _callback(self, name: str, dead: bool, producer: Publisher, slot: int | None) -> Callable[[Message], None]:
        return lambda message: self._on_message(name, dead, message, producer, slot)

    def _set_connected(self, delta: int) -> None:
        with self._lock:
            self._connected += delta
            metrics.BUS_UP.labels(self.service).set(1 if self._connected else 0)

    # --- one message (on the bus thread) -----------------------------------
    def _on_message(self, name: str, dead: bool, message: Message, producer: Publisher, slot: int | None) -> None:
        verdict = self._triage(name, dead, message)
        if verdict is None:  # a second chance, from the dead-letter queue
            message.reject(requeue=False)
            return
        if verdict is _PASS:
            self._pass(name, message, producer)
            return
        if isinstance(verdict, str):
            self._send(message, self.replier.dead(name, message.body, _cid(message), verdict), producer)
            message.ack()
            return
        if slot is None and verdict == SECOND:
            self._held.append((time.monotonic() + HOLD_SECONDS, name, message))  # run once another replica is up
            self._next_check = 0.0
            self._poke()
        elif slot is None:
            self._work.put((name, message, verdict))
        else:  # embedded bus: inline
            self._send(message, self._handle(slot, name, message.body, _cid(message), verdict), producer)
            message.ack()

    def _triage(self, name: str, dead: bool, message: Message) -> bytes | str | None:
        """Run it (the journal kind), refuse it (why, str), or None: reject it to its dead-letter queue."""
        cid = _cid(message)
        blamed = self.journal.blame(cid) if self.journal is not None else None
        sure = blamed is not None and (blamed[1] or blamed[0] == SECOND)
        if sure:
            return (f"the previous {self.service} process on this host died handling it "
                    f"{'in its second chance' if blamed[0] == SECOND else 'alone'} and was restarted")
        if dead:
            headers = message.headers or {}
            death = headers.get("x-death") or [{}]
            if message.delivery_info.get("redelivered") or int(headers.get("x-delivery-count") or 0) > 0:
                return f"its second chance also ended with the death of the {self.service} process holding it"
            if str(death[0].get("reason", "")) != "rejected" or self.limit < 2:
                return f"each of its deliveries ended with the death of the {self.service} process holding it"
            if blamed is not None and _passes(headers).count(self._identity) < _PASSES:
                return _PASS  # this process's predecessor died with it among others: another replica runs it
            log.warning("%s: request %s on %s: second chance, alone", self.service, cid, name)
            return SECOND
        failed = int((message.headers or {}).get("x-delivery-count") or 0)  # quorum queues: returned deliveries
        if is_versioned(name) and (blamed is not None or (self.limit >= 2 and failed >= self.limit - 1)):
            log.warning("%s: request %s on %s was held by a process that died (%d time(s)): given a second chance "
                        "apart from other requests", self.service, cid, name, failed)
            return None
        return FIRST

    def _release_held(self, channel: object) -> None:
        """Hand held second chances to the handlers once another replica consumes their queue (or after
        HOLD_SECONDS): if the second chance kills this process too, a replica stays alive to serve the rest."""
        now = time.monotonic()
        if not self._held or now < self._next_check:
            return
        self._next_check = now + _HOLD_CHECK
        held, self._held = self._held, []
        for until, name, message in held:
            if message.channel is not channel:
                continue  # its connection broke: the broker has returned it
            if now >= until or self._others_consume(channel, name):
                self._work.put((name, message, SECOND))
            else:
                self._held.append((until, name, message))

    def _others_consume(self, channel: object, name: str) -> bool:
        """Whether a process besides this one consumes ``name``'s request queue (one channel per process)."""
        queue_name = request_queue(name, self.limit).name
        declared = channel.queue_declare(queue=queue_name, passive=True)  # type: ignore[attr-defined]
        return int(declared.consumer_count) >= 2

    @property
    def _identity(self) -> str:
        return self.journal.identity if self.journal is not None else ""

    def _pass(self, name: str, message: Message, producer: Publisher) -> None:
        """Put a second chance back on its dead-letter queue for another replica (back here a 4th time, it runs)."""
        log.warning("%s: request %s on %s was among those the previous process on this host was handling when "
                    "it died: its second chance is left to another replica", self.service, _cid(message), name)
        headers = message.headers or {}
        # through kombu: the content type as received (kombu reads a missing one as application/data)
        producer.producer.publish(message.body, exchange=DEAD_EXCHANGE.name, routing_key=name, retry=False,
                                  headers={**headers, PASSED_BY: [*_passes(headers), self._identity]},
                                  content_type=message.content_type, content_encoding=message.content_encoding,
                                  correlation_id=_cid(message), reply_to=message.properties.get("reply_to"))
        message.ack()

    # --- handler threads ---------------------------------------------------
    def _handle_loop(self, slot: int) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            name, message, kind = item
            if message.channel is not self._channel:
                continue  # its connection broke: the broker has returned it
            reply = self._handled(slot, name, message.body, _cid(message), kind)
            self._done.put((message, reply))  # None: acked unanswered rather than held until the connection closes
            self._poke()

    def _handled(self, slot: int, name: str, body: bytes | str, cid: str | None, kind: bytes) -> bytes | None:
        """:meth:`_handle` on a handler thread, which must survive anything: None if it failed (logged)."""
        try:
            return self._handle(slot, name, body, cid, kind)
        except Exception:  # noqa: BLE001 - the replier answers every handler error; this is the journal's
            log.exception("%s: request %s on %s not handled", self.service, cid, name)
            return None

    def _handle(self, slot: int, name: str, body: bytes | str, cid: str | None, kind: bytes) -> bytes | None:
        journal = self.journal
        if journal is not None and cid:
            journal.begin(slot, cid, kind)
        try:
            return self.replier.handle(name, body)
        finally:
            if journal is not None and cid:
                journal.end(slot)

    def _send(self, message: Message, reply: bytes | None, producer: Publisher) -> None:
        reply_to = message.properties.get("reply_to")
        if reply is not None and reply_to:
            # the reply exchange when the sender asks for it; a sender older than the exchanges waits on the
            # default exchange (its user may still publish there: docs/upgrading.md)
            via = (message.headers or {}).get(REPLY_VIA)
            producer.publish(
                reply,
                REPLY_EXCHANGE if via == REPLY_EXCHANGE.name else "",
                reply_to,
                content_type="application/json",
                content_encoding="utf-8",
                correlation_id=message.properties.get("correlation_id"),
            )


def _passes(headers: dict) -> list[str]:
    passed = headers.get(PASSED_BY)
    return [str(p) for p in passed] if isinstance(passed, (list, tuple)) else []


def _cid(message: Message) -> str | None:
    return message.properties.get("correlation_id")
