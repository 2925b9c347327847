"""The frame protocol between a PluginPool and its worker processes, and the progress page they share.

Each message is one frame: a 4-byte big-endian size, then that many bytes of
compact UTF-8 JSON (never pickle: the worker runs untrusted code).

This module imports only the standard library: the worker process imports it.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
_LAYOUT = struct.Struct("=dq")  # the progress page: start time of the unit, its index in the batch
ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode_frame(message: dict[str, Any]) -> bytes:
    """One protocol frame: size header + compact JSON (raises if not JSON-able).

    JSON has no tuples: they are encoded as arrays, so the reader gets lists.
    """
    return encode_frame_bytes(encode_json(message))


def encode_json(message: dict[str, Any]) -> bytes:
    """Compact JSON of ``message``, without a frame header (a part of a batch reply)."""
    return ENCODER.encode(message).encode()


def encode_frame_bytes(payload: bytes) -> bytes:
    """One protocol frame around ``payload`` (JSON text already encoded)."""
    return HEADER.pack(len(payload)) + payload


#: The end of a reply frame that holds a run of 19 digits or more not after a ".": an integer of 10**18 or more,
#: which the pool's orjson would read as a float when past 64 bits. A float's digits after its point may run that
#: long (0.000123456789012345678), but the whole part of a float is never written with more than 16 digits.
LONG_NUMBERS = b',"long_numbers":true}'
#: digits -> "0", "." stays, anything else -> " "
_DIGITS = bytes(48 if 48 <= i <= 57 else i if i == 46 else 32 for i in range(256))


def reply_frame(body: bytes) -> bytes:
    """The frame of a reply (a JSON object), marked with LONG_NUMBERS if it needs the pool's stdlib reader."""
    if b" " + b"0" * 19 in body.translate(_DIGITS):  # the body starts with "{": a run has a character before it
        body = body[:-1] + LONG_NUMBERS
    return encode_frame_bytes(body)


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` completely (a pipe may accept a large frame in pieces)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Channel:
    """The worker's end of the protocol pipes."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._reader = os.fdopen(read_fd, "rb", buffering=1 << 16)
        self._write_fd = write_fd

    def receive(self) -> dict[str, Any] | None:
        header = self._reader.read(HEADER.size)
        if len(header) < HEADER.size:
            return None
        (size,) = HEADER.unpack(header)
        payload = self._reader.read(size)
        if len(payload) < size:
            return None
        message = json.loads(payload)
        return message if isinstance(message, dict) else {}

    def send(self, frame: bytes) -> None:
        write_all(self._write_fd, frame)


class Progress:
    """The progress page a plugin worker shares with its pool: which unit of a batch it is running (either side).

    A worker runs the units of one request that went to it one after the other and answers them in one
    frame. So that the pool can still enforce each unit's own time budget, and tell which unit was running
    when the worker died, the worker writes the index of the unit it starts and the time it started
    (``CLOCK_MONOTONIC``, the same clock in every process) into a small shared memory page, a ``memfd`` the pool
    created and passed to it. Writing it is a memory store, no system call; the pool reads it only when a
    budget may have run out or the worker died.

    The worker runs untrusted code, which may write anything there: the pool bounds what it reads (an index
    within the batch, a start time between the batch's start and now), so a lying plugin can only blame another
    unit of its own request, never delay a kill past the batch's own budget.
    """

    def __init__(self, fd: int) -> None:
        """The page of memfd ``fd`` (:meth:`create`), mapped; ``fd`` is closed (the mapping keeps the page)."""
        self._page = mmap.mmap(fd, _LAYOUT.size)
        os.close(fd)

    @staticmethod
    def create() -> int:
        """A new page for a worker (the pool's side): its descriptor, to pass to the worker, then to map."""
        fd = os.memfd_create("vmsched-progress", os.MFD_CLOEXEC)  # a worker gets it through pass_fds
        os.ftruncate(fd, _LAYOUT.size)
        return fd

    def mark(self, index: int) -> None:
        """The worker starts unit ``index`` now."""
        _LAYOUT.pack_into(self._page, 0, time.monotonic(), index)

    def read(self, count: int, since: float, now: float) -> tuple[int, float]:
        """(index, start) of the unit in progress, bounded to a batch of ``count`` started at ``since``."""
        started, index = _LAYOUT.unpack_from(self._page, 0)
        index = min(max(int(index), 0), count - 1)
        # not written for this batch yet (an earlier batch's mark is older than ``since``), or nonsense: its first unit
        if not since <= started <= now:
            return 0, since
        return index, started

    def close(self) -> None:
        self._page.close()
