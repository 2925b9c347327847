"""The other gateway replicas' decisions, asked for when read: nothing is published per decision.

Each gateway (on RabbitMQ; the embedded bus has one gateway) binds its own
exclusive queue ``vmsched.decisions.gateway.<token>`` to ``vmsched.events``
with three keys:

- ``gateway.decisions.query``: a reader's question (a list with filters, or
  one ID) from any replica; it is answered from this gateway's ring;
- ``gateway.decisions.answer.<token>``: the answers to this gateway's questions;
- ``gateway.decisions.presence``: who is there. A gateway says hello when it
  subscribes (every replica answers with its own presence), repeats it every
  :data:`BEACON` seconds and says goodbye when it stops. A replica not heard
  from for :data:`FORGET` seconds is dropped from the directory.

:meth:`PeerLink.ask` publishes a question with a correlation ID and the
asker's token (its reply-to), and gathers the answers for at most
:data:`WINDOW` seconds: it returns as soon as every known replica answered,
else at the window's end, naming the replicas that did not answer. No
question ever hangs a reader longer than the window.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from vmsched.bus.interface import Publish, Topic, Transport
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.gateway import replica_messages

log = logging.getLogger("vmsched.gateway.decisions")

QUERY_KEY = "gateway.decisions.query"
PRESENCE_KEY = "gateway.decisions.presence"
ANSWER_PREFIX = "gateway.decisions.answer."
#: seconds a reader waits for the other replicas at most
WINDOW = 0.5
#: seconds between presence beacons; a replica silent for FORGET seconds is forgotten
BEACON = 30.0
FORGET = 3 * BEACON + 10.0
#: bytes of records in one answer at most (the rest is left out and the answer says so)
MAX_ANSWER = 4 << 20
MAX_MESSAGE = 8 << 20
_QID = re.compile(r"^[0-9a-f]{16}$")

#: (question) -> (records, truncated); runs on the link's thread
Answerer = Callable[[dict[str, Any]], tuple[list[dict[str, Any]], bool]]


@dataclass
class Gathered:
    """What the other replicas answered to one question; for a reader, with this gateway's records."""

    records: list[dict[str, Any]] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)  # their labels
    missing: list[dict[str, str]] = field(default_factory=list)  # {"gateway": label, "error": why}
    truncated: list[str] = field(default_factory=list)  # replicas whose answer was cut at MAX_ANSWER

    def replicas(self, gateway: str) -> dict[str, Any]:
        """The ``replicas`` part of an API answer: who answered, who did not and why."""
        return {"answered": [gateway, *self.answered], "missing": self.missing, "truncated": self.truncated}


@dataclass
class _Question:
    loop: asyncio.AbstractEventLoop
    expected: set[str]
    first_found: bool  # a search for one ID: the first answer holding it ends the wait
    gathered: Gathered = field(default_factory=Gathered)
    heard: set[str] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class PeerLink:
    """One gateway's side of the question-and-answer exchange with the other replicas: a subscription of the
    process's transport (its own thread and, on RabbitMQ, its own connection, reconnecting with backoff)."""

    def __init__(self, transport: Transport, gateway: str, answer: Answerer) -> None:
        self.gateway = gateway
        self.answer = answer
        self.token = replica_messages.new_token()
        self.queue_name = f"vmsched.decisions.gateway.{self.token}"
        self.publisher = transport.events(f"gateway-{gateway}")
        topic = Topic(self.queue_name, EVENTS_EXCHANGE, (QUERY_KEY, PRESENCE_KEY, ANSWER_PREFIX + self.token), 1000)
        self.subscription = transport.subscribe("gateway-decision-peers", topic, self._handle,
                                                on_subscribed=self._subscribed, tick=self._beacon)
        self.ready = self.subscription.ready  # subscribed at least once
        self._next_beacon = 0.0
        self._peers: dict[str, tuple[str, float]] = {}  # token -> (label, last heard, monotonic)
        self._lock = threading.Lock()
        self._questions: dict[str, _Question] = {}

    # --- who is there ---------------------------------------------------------------------------
    def peers(self) -> dict[str, str]:
        """token -> label of the replicas heard from in the last FORGET seconds (not this one)."""
        now = time.monotonic()
        with self._lock:
            for token in [t for t, (_, at) in self._peers.items() if now - at > FORGET]:
                del self._peers[token]
            return {t: label for t, (label, _) in self._peers.items()}

    def _heard(self, token: str, label: str) -> None:
        """Another replica (_handle checked the token) was heard from."""
        with self._lock:
            self._peers[token] = (label, time.monotonic())

    def _presence(self, hello: bool = False, gone: bool = False) -> None:
        self.publisher.publish(PRESENCE_KEY, {"gateway": self.gateway, "token": self.token, "hello": hello,
                                              "gone": gone})

    # --- asking ------------------------------------------------------------------------------------
    async def ask(self, question: dict[str, Any], window: float = WINDOW) -> Gathered:
        """Ask every other replica; their answers within ``window`` seconds (bounded: never longer)."""
        expected = self.peers()
        if not expected:  # one gateway (or none other heard from: every replica answers a newcomer's hello)
            return Gathered() if self.ready.is_set() else Gathered(
                missing=[{"gateway": "(other replicas)", "error": "not subscribed to the bus yet"}])
        qid = secrets.token_hex(8)
        state = _Question(asyncio.get_running_loop(), set(expected), first_found="id" in question)
        with self._lock:
            self._questions[qid] = state
        body = {**question, "qid": qid, "from": self.token, "gateway": self.gateway}
        sent = True  # unless the bus refuses it; slow to go out, the replicas did not answer in time either way
        try:
            async with asyncio.timeout(window):
                sent = await asyncio.to_thread(self.publisher.publish, QUERY_KEY, body)
                if sent:
                    await state.done.wait()
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._questions.pop(qid, None)
        gathered = state.gathered
        if state.first_found and gathered.records:
            return gathered  # found: the others need not answer
        why = f"no answer within {window:g} s" if sent else "the bus is unavailable: question not sent"
        gathered.missing = [{"gateway": expected[t], "error": why} for t in sorted(expected) if t not in state.heard]
        return gathered

    def _answered(self, qid: str, token: str, label: str, records: list[dict[str, Any]], truncated: bool) -> None:
        """On the asker's event loop."""
        with self._lock:
            state = self._questions.get(qid)
        if state is None or token in state.heard:
            return
        state.heard.add(token)
        state.gathered.answered.append(label)
        state.gathered.records.extend(records)
        if truncated:
            state.gathered.truncated.append(label)
        if state.expected <= state.heard or (state.first_found and records):
            state.done.set()

    # --- the link's thread -------------------------------------------------------------------------
    def start(self) -> None:
        self.subscription.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self.ready.is_set():
            self._presence(gone=True)
        self.subscription.stop(timeout)
        self.publisher.close()

    def _subscribed(self, publish: Publish) -> None:
        self._presence(hello=True)
        self._next_beacon = time.monotonic() + BEACON

    def _beacon(self) -> None:
        if time.monotonic() >= self._next_beacon:
            self._presence()
            self._next_beacon = time.monotonic() + BEACON

    def _handle(self, body: bytes, routing_key: str) -> None:
        message = replica_messages.read(body, routing_key, MAX_MESSAGE, log, "decision peers")
        if message is None:
            return
        token, label = message.get("token") or message.get("from"), message.get("gateway")
        if not replica_messages.from_another(token, self.token) or not isinstance(label, str):
            return  # our own question or presence, or not well formed
        if routing_key == PRESENCE_KEY and message.get("gone") is True:
            with self._lock:
                self._peers.pop(token, None)
        elif routing_key == PRESENCE_KEY:
            self._heard(token, label)
            if message.get("hello") is True:
                self._presence()  # a newcomer learns of us at once
        elif routing_key == QUERY_KEY:
            self._heard(token, label)
            self._on_question(token, message)
        elif routing_key == ANSWER_PREFIX + self.token:
            self._on_answer(token, label, message)

    def _on_question(self, token: str, message: dict[str, Any]) -> None:
        qid = message.get("qid")
        if not isinstance(qid, str) or not _QID.match(qid):
            return
        try:
            records, truncated = self.answer(message)
        except Exception:  # noqa: BLE001 - a bad question must not stop the link
            log.exception("answering a decision question failed")
            records, truncated = [], False
        self.publisher.publish(ANSWER_PREFIX + token, {"qid": qid, "token": self.token, "gateway": self.gateway,
                                                       "decisions": records, "truncated": truncated})

    def _on_answer(self, token: str, label: str, message: dict[str, Any]) -> None:
        self._heard(token, label)
        qid, records = message.get("qid"), message.get("decisions")
        if not isinstance(qid, str) or not isinstance(records, list):
            return
        with self._lock:
            state = self._questions.get(qid)
        if state is None:
            return  # too late: the reader has its answer already
        kept = [r for r in records if isinstance(r, dict) and r.get("gateway") == label and well_formed(r)]
        state.loop.call_soon_threadsafe(self._answered, qid, token, label, kept, message.get("truncated") is True)


def well_formed(record: dict[str, Any]) -> bool:
    return (isinstance(record.get("id"), str) and isinstance(record.get("op"), str)
            and isinstance(record.get("time"), (int, float)) and isinstance(record.get("hosts"), list)
            and isinstance(record.get("units"), list) and isinstance(record.get("summary"), str)
            and isinstance(record.get("vm"), str) and all(isinstance(u, dict) for u in record["units"]))
