"""Unguessable tokens for correlation IDs, without a system call per token."""

from __future__ import annotations

import os


class Unguessable:
    """8 random bytes from the OS, as hex, per call; read ``batch`` calls' worth at a time.

    ``os.urandom`` releases the GIL around its system call, and in a busy process (the all-in-one's gateway
    and services share one) each release can hand the GIL to another thread. Not thread-safe: one per thread.
    """

    def __init__(self, batch: int = 512) -> None:
        self._size = 8 * batch
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        if self._at >= len(self._pool):
            self._pool, self._at = os.urandom(self._size), 0
        token = self._pool[self._at:self._at + 8].hex()
        self._at += 8
        return token
