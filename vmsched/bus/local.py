"""The all-in-one's scheduling requests, handed from their sender to the services' threads with no transport.

On the embedded bus (``memory://``) the gateway and the services share one process. kombu's in-memory
transport still carries what is not a scheduling request (agents' requests, events, facts), but a request to
a scheduling queue (:data:`~vmsched.bus.topology.REQUEST_QUEUES`) needs none of a transport's work: routing
through an exchange, a message object and its properties, a queue per consumer thread, a pipe to wake the
event loop for the reply, and a drain of the reply queue. Here the sender puts the envelope's bytes in the
inbox of the worker that serves the queue, with a callable for the reply; one of the worker's threads answers
with the same :class:`~vmsched.bus.replies.Replier` as on RabbitMQ and hands the reply's bytes to the
callable (the gateway's: ``loop.call_soon_threadsafe``). The bytes are those of the bus, so the contract
(versions, validation, deadlines, errors, metrics) is the same; only the transport is gone.

What a queue of the bus would do, an inbox does: a request put before its worker starts waits for it, and
the threads of every worker bound to a queue take its requests in turn. Nothing is acknowledged: in one
process there is nobody to redeliver to (a death ends the gateway too).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Callable, Iterable

from vmsched.bus.topology import REQUEST_QUEUES

#: The queues whose requests take this path on the embedded bus.
CARRIED = frozenset(REQUEST_QUEUES.values())
#: How long a thread waits for a request before it looks at its stop flag again, seconds.
WAIT = 1.0

Inbox = SimpleQueue["Request | None"]


@dataclass(frozen=True, slots=True)
class Request:
    queue: str
    body: bytes
    cid: str
    #: called with the reply's bytes (from the worker's thread); None: nobody waits for a reply
    reply: Callable[[bytes], None] | None


def carries(queues: Iterable[str]) -> bool:
    """Whether requests to all of ``queues`` go through inboxes on the embedded bus."""
    names = set(queues)
    return bool(names) and names <= CARRIED


class Lanes:
    """The inboxes of one process, by queue name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inboxes: dict[str, Inbox] = {}
        self._bound: dict[int, tuple[frozenset[str], int]] = {}  # id(inbox) -> its queues, the workers bound

    def bind(self, queues: Iterable[str]) -> Inbox:
        """The inbox a worker takes the requests of ``queues`` from, with those that waited for it."""
        names = frozenset(queues)
        if not carries(names):
            raise ValueError(f"not scheduling request queues: {sorted(names - CARRIED)}")
        with self._lock:
            found = {id(inbox): inbox for name in names if (inbox := self._inboxes.get(name)) is not None}
            for key in found:
                if self._bound.get(key, (names, 0))[0] != names:  # threads would get requests they cannot handle
                    raise ValueError(f"queues {sorted(names)} overlap another worker's {sorted(self._bound[key][0])}")
            if len(found) == 1:
                inbox = next(iter(found.values()))
            else:  # none yet, or requests waiting in several: one inbox (each queue's requests in their order)
                inbox = SimpleQueue()
                for waiting in found.values():
                    while not waiting.empty():
                        inbox.put(waiting.get_nowait())
            for name in names:
                self._inboxes[name] = inbox
            self._bound[id(inbox)] = (names, self._bound.get(id(inbox), (names, 0))[1] + 1)
            return inbox

    def release(self, inbox: Inbox) -> None:
        """A worker of ``inbox`` stopped (its threads ended). With no worker left, what waits in it waits in
        its queue's own inbox again, for the next worker of that queue, whatever other queues it serves."""
        with self._lock:
            names, workers = self._bound.get(id(inbox), (frozenset(), 1))
            if workers > 1:
                self._bound[id(inbox)] = (names, workers - 1)
                return
            self._bound.pop(id(inbox), None)
            for name in names:
                if self._inboxes.get(name) is inbox:
                    del self._inboxes[name]
            while not inbox.empty():
                request = inbox.get_nowait()
                if request is not None:  # not a stop's wake-up
                    self._inboxes.setdefault(request.queue, SimpleQueue()).put(request)

    def put(self, request: Request) -> None:
        with self._lock:
            inbox = self._inboxes.get(request.queue)
            if inbox is None:  # no worker yet: the request waits for the one that binds its queue
                inbox = self._inboxes[request.queue] = SimpleQueue()
        inbox.put(request)


def serve(inbox: Inbox, stop: threading.Event, answer: Callable[[Request], bytes | None]) -> None:
    """Answer the requests of ``inbox`` on this thread until ``stop`` is set (a None in the inbox wakes it)."""
    while not stop.is_set():
        try:
            request = inbox.get(timeout=WAIT)
        except Empty:
            continue
        if request is None:
            continue  # a stop's wake-up (maybe of another worker of the inbox: this one goes on)
        reply = answer(request)
        if reply is not None and request.reply is not None:
            request.reply(reply)


#: This process's inboxes (the all-in-one's).
LANES = Lanes()
