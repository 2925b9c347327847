"""The frame protocol between a PluginPool and its worker processes.

Each message is one frame: a 4-byte big-endian size, then that many bytes of
compact UTF-8 JSON (never pickle: the worker runs untrusted code).

This module imports only the standard library: the worker process imports it.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

HEADER = struct.Struct(">I")
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


#: The end of a reply frame that holds a run of 19 digits or more: an integer of 10**18 or more, which the
#: pool's orjson would read as a float when past 64 bits (no float is written with such a run).
LONG_NUMBERS = b',"long_numbers":true}'
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))  # digits -> "0", anything else -> " "


def reply_frame(body: bytes) -> bytes:
    """The frame of a reply (a JSON object), marked with LONG_NUMBERS if it needs the pool's stdlib reader."""
    if b"0" * 19 in body.translate(_DIGITS):
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
