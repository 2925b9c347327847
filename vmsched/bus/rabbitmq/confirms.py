"""Publisher confirms of one channel, awaited without blocking: what each publish was, until the broker settles it.

Two parties publish in confirm mode. The gateway's client (:mod:`client`) keeps each request's correlation ID
until it is confirmed, sends again what a nack refused and finds the confirms overdue. A service worker
(:mod:`worker`) acknowledges a request only once what it published for it (its reply, or its second chance's
copy) is confirmed: a reply published without a confirm can be lost when a broker node dies while the
request's ack, sent after it, is already replicated; and the broker's own dead-lettering from a quorum queue is
at most once. A refused publish (a nack) leaves its request unacknowledged; the worker then takes a new
connection and the broker delivers the request again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Confirms(Generic[T]):
    """The publishes of the current channel (:meth:`watch` each new one), on the thread that owns it.

    ``on_ack`` and ``on_nack`` get the items the broker's basic.ack or basic.nack settles, in publish order.
    """

    def __init__(self, on_ack: Callable[[list[T]], None], on_nack: Callable[[list[T]], None]) -> None:
        self._on_ack, self._on_nack = on_ack, on_nack
        self._tag = 0  # last publish's delivery tag on the channel
        self._waiting: OrderedDict[int, tuple[T, float]] = OrderedDict()  # tag -> (item, time.monotonic())

    def __len__(self) -> int:
        return len(self._waiting)

    def watch(self, channel: object) -> None:
        """Put ``channel`` in confirm mode and count its publishes from now on."""
        self._tag = 0
        self._waiting.clear()
        channel.confirm_select()  # type: ignore[attr-defined]
        channel.events["basic_ack"].add(self.ack)  # type: ignore[attr-defined]
        channel.events["basic_nack"].add(self.nack)  # type: ignore[attr-defined]

    def published(self, item: T | None) -> None:
        """One message was published on the channel; ``item`` is settled with its confirm (None: nothing waits)."""
        self._tag += 1
        if item is not None:
            self._waiting[self._tag] = (item, time.monotonic())

    def ack(self, tag: int, multiple: bool) -> None:
        items = self._settle(tag, multiple)
        if items:
            self._on_ack(items)

    def nack(self, tag: int, multiple: bool) -> None:
        items = self._settle(tag, multiple)
        if items:
            self._on_nack(items)

    def overdue(self, timeout: float) -> list[tuple[T, float]]:
        """The items published more than ``timeout`` seconds ago and not confirmed (forgotten here), oldest
        first, each with its ``time.monotonic()`` of publication."""
        limit, due = time.monotonic() - timeout, []
        while self._waiting:
            tag, (item, at) = next(iter(self._waiting.items()))
            if at > limit:
                break
            del self._waiting[tag]
            due.append((item, at))
        return due

    def _settle(self, tag: int, multiple: bool) -> list[T]:
        if not multiple:
            settled = self._waiting.pop(tag, None)
            return [settled[0]] if settled is not None else []
        items = []
        while self._waiting:
            first = next(iter(self._waiting))
            if first > tag:
                break
            items.append(self._waiting.pop(first)[0])
        return items
