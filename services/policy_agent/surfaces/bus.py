"""The agent on the bus: its RPC queue ``vmsched.agent.<host_id>`` and its events.

The queue is bound to the ``vmsched.agent`` topic exchange with the host ID as
key (only the gateway's broker user may publish there); replies go through the
``vmsched.reply`` exchange, events through ``vmsched.events`` (topology.py).

Requests use the same operations as the local socket (:mod:`ops`, the models
of :mod:`vmsched.agent_contract`); an error reply carries its code in the
reply envelope (``code``: invalid, not_found, unavailable, internal) and
every reason of a refusal in ``details``. A request of contract version 1 is
answered in version 1's words (``"<code>: <message>"``), by the bus worker.
Events are published from a queue by one thread: libvirt's event thread only
enqueues, and a broker outage drops events (logged), never blocks the agent.
"""

from __future__ import annotations

import logging
import queue
import threading

from vmsched.bus import RequestError
from vmsched.bus.interface import Transport
from vmsched.bus.topology import agent_queue, event_key
from vmsched.messages import CONTRACT_VERSION, Envelope

from ..errors import AgentError, PolicyError
from ..plural import plural
from .ops import Agent, dispatch

log = logging.getLogger(__name__)


class AgentBus:
    """The agent on the bus: it answers its queue's requests and publishes its events."""

    def __init__(self, transport: Transport, host_id: str, agent: Agent, consumers: int = 2, backlog: int = 10000):
        self.host_id = host_id
        self.agent = agent
        self.queue_name = agent_queue(host_id)
        self.worker = transport.worker("agent", {self.queue_name: self._handle}, consumers=consumers, prefetch=4)
        self.publisher = transport.events("agent")
        self._events: queue.Queue[tuple[str, dict] | None] = queue.Queue(maxsize=backlog)
        self._thread = threading.Thread(target=self._publish_loop, name="agent-events", daemon=True)
        self._dropped = 0

    def start(self) -> None:
        self.worker.start()
        self._thread.start()
        log.info("serving requests on bus queue %s", self.queue_name)

    def stop(self) -> None:
        self.worker.stop()
        self._events.put(None)
        self._thread.join(5)
        self.publisher.close()

    def _handle(self, env: Envelope) -> dict:
        try:
            return dispatch(self.agent, env.op, env.body)
        except AgentError as exc:
            details = exc.errors if isinstance(exc, PolicyError) else ()
            raise RequestError(str(exc), exc.code, details) from None

    def publish(self, event: str, body: dict) -> None:
        try:
            self._events.put_nowait((event, body))
        except queue.Full:
            self._dropped += 1
            if self._dropped % 1000 == 1:
                log.warning("event backlog full: %s dropped so far", plural(self._dropped, "event"))

    def _publish_loop(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            event, body = item
            try:
                self.publisher.publish(event_key(self.host_id, event), {"v": CONTRACT_VERSION, **body})
            except Exception:  # noqa: BLE001 - events are best effort
                log.exception("publishing %s event failed", event)
