"""Publisher confirms awaited without blocking: which request each delivery tag was, and which are overdue."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable


class Confirms:
    """The confirms awaited on the current channel (:meth:`reset` for each new one), on the thread that owns it.

    The broker's basic.ack or basic.nack arrives like any frame; ``on_nack`` gets the correlation ids a nack
    covers. :meth:`overdue` hands out those not confirmed in time, with when each was published.
    """

    def __init__(self, on_nack: Callable[[list[str]], None]) -> None:
        self._on_nack = on_nack
        self._tag = 0  # last publish delivery tag on the channel
        self._unconfirmed: OrderedDict[int, tuple[str, float]] = OrderedDict()  # tag -> (correlation id, published)

    def __bool__(self) -> bool:
        return bool(self._unconfirmed)

    def reset(self, channel: object) -> None:
        """Watch ``channel`` (in confirm mode from now on)."""
        self._tag = 0
        self._unconfirmed.clear()
        channel.confirm_select()  # type: ignore[attr-defined]
        channel.events["basic_ack"].add(self.ack)  # type: ignore[attr-defined]
        channel.events["basic_nack"].add(self.nack)  # type: ignore[attr-defined]

    def published(self, cid: str) -> None:
        self._tag += 1
        self._unconfirmed[self._tag] = (cid, time.monotonic())

    def ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def nack(self, tag: int, multiple: bool) -> None:
        cids = self._settle(tag, multiple)
        if cids:
            self._on_nack(cids)

    def overdue(self, timeout: float) -> list[tuple[str, float]]:
        """The requests published more than ``timeout`` seconds ago and not confirmed (forgotten here), oldest
        first, each with its ``time.monotonic()`` of publication."""
        limit, due = time.monotonic() - timeout, []
        while self._unconfirmed:
            tag, (cid, at) = next(iter(self._unconfirmed.items()))
            if at > limit:
                break
            del self._unconfirmed[tag]
            due.append((cid, at))
        return due

    def _settle(self, tag: int, multiple: bool) -> list[str]:
        if not multiple:
            settled = self._unconfirmed.pop(tag, None)
            return [settled[0]] if settled is not None else []
        cids = []
        while self._unconfirmed:
            first = next(iter(self._unconfirmed))
            if first > tag:
                break
            cids.append(self._unconfirmed.pop(first)[0])
        return cids
