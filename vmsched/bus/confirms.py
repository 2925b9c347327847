"""Publisher confirms awaited asynchronously: which request each delivery tag was, and which are overdue."""

from __future__ import annotations

import asyncio
from typing import Callable


class Confirms:
    """The confirms of the current channel (:meth:`reset` for each new one).

    The broker's basic.ack or basic.nack arrives like any frame; ``on_nack`` gets the correlation ids a
    nack covers, ``on_overdue`` one whose confirm did not come within ``timeout`` seconds.
    """

    def __init__(self, timeout: float, on_nack: Callable[[list[str]], None], on_overdue: Callable[[str], None]) -> None:
        self.timeout = timeout
        self._on_nack = on_nack
        self._on_overdue = on_overdue
        self._generation = 0  # channels so far: a timer of an older one is stale
        self._tag = 0  # last publish delivery tag on the channel
        self._unconfirmed: dict[int, str] = {}  # delivery tag -> correlation id

    def reset(self, channel: object) -> None:
        """Watch ``channel`` (in confirm mode from now on)."""
        self._generation += 1
        self._tag = 0
        self._unconfirmed.clear()
        channel.confirm_select()  # type: ignore[attr-defined]
        channel.events["basic_ack"].add(self.ack)  # type: ignore[attr-defined]
        channel.events["basic_nack"].add(self.nack)  # type: ignore[attr-defined]

    def published(self, cid: str, loop: asyncio.AbstractEventLoop) -> None:
        self._tag += 1
        self._unconfirmed[self._tag] = cid
        loop.call_later(self.timeout, self._overdue, self._generation, self._tag)

    def ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def nack(self, tag: int, multiple: bool) -> None:
        cids = self._settle(tag, multiple)
        if cids:
            self._on_nack(cids)

    def _settle(self, tag: int, multiple: bool) -> list[str]:
        tags = [t for t in self._unconfirmed if t <= tag] if multiple else [tag]
        return [cid for t in tags if (cid := self._unconfirmed.pop(t, None)) is not None]

    def _overdue(self, generation: int, tag: int) -> None:
        if generation != self._generation:
            return  # a timer of a channel replaced since: its requests went out again
        cid = self._unconfirmed.pop(tag, None)
        if cid is not None:
            self._on_overdue(cid)
