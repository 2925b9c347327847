"""The gateway's request client on RabbitMQ, as the asyncio event loop sees it.

Each request goes to the :class:`~vmsched.bus.rabbitmq.link.Link`, which owns the connection on the same loop
(publishing, confirms, replies, heartbeats, reconnection, sending again), and the call awaits a future that the
link settles: the reply's bytes, or an error. Every wait of the link on the broker is bounded, and connecting
runs in the loop's executor, so a frozen or unreachable broker does not hold the loop: ``/healthz`` answers,
and every call is answered (a reply, or an error) by its deadline.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any

from vmsched.bus import BusUnavailable
from vmsched.bus.options import BusOptions
from vmsched.bus.interface import BusClient, Mark, request_bytes, settle
from vmsched.bus.rabbitmq.link import Link, Outgoing
from vmsched.bus.tokens import Unguessable
from vmsched.bus.topology import AGENT_EXCHANGE, route

#: The longest wait of :meth:`AsyncBusClient.start` for the first connection attempt, beyond its own timeouts.
_START_SLACK = 10.0


class AsyncBusClient(BusClient):
    def __init__(self, options: BusOptions, declare: tuple[str, ...] = (), service: str = "gateway") -> None:
        super().__init__(service)
        self.options = options
        self._declare = declare
        self._token = Unguessable()  # used on the event loop's thread only
        self._link: Link | None = None

    # --- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        """Start the link and wait for its first connection attempt (made or failed)."""
        link = self._link = Link(self.options, self.service, self._declare, self._settle)
        link.start()
        bound = (self.options.connect_timeout + link.io_timeout) * len(self.options.urls) + _START_SLACK
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(link.attempted.wait(), bound)

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.stop()
        await super().close()

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.up

    @property
    def last_error(self) -> str:
        return self._link.last_error if self._link is not None else "not started"

    # --- calls ---------------------------------------------------------------
    def request_id(self) -> str:
        # unguessable, so that no other user of the reply exchange can answer in an agent's place
        return f"{self._token()}-{next(self._ids)}"

    def send(self, cid: str, future: asyncio.Future[bytes], queue: str, op: str, body: dict[str, Any],
             deadline: float, mark: Mark) -> None:
        link = self._link
        if link is None or not (link.up or link.recovering):  # else no node answers: it fails at once
            raise BusUnavailable(f"message bus unavailable: {self.last_error}")
        exchange, key = route(queue)
        link.submit(cid, Outgoing(queue, exchange, key, request_bytes(op, deadline, body, mark), deadline,
                                  resend=exchange is not AGENT_EXCHANGE))

    def _settle(self, cid: str, outcome: bytes | BaseException) -> None:
        """A request's reply or error."""
        settle(self._pending.get(cid), outcome)
