"""Tests that must never run at once, across pytest-xdist workers and test runs side by side."""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Hold the lock ``name`` (a file in /tmp) for the block; wait while another process holds it."""
    with open(f"/tmp/vmsched-tests-{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
