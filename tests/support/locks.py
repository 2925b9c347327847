"""Tests that must never run at once, across pytest-xdist workers and test runs side by side."""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from typing import Iterator

import pytest


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Hold the lock ``name`` (a file in /tmp) for the block; wait while another process holds it."""
    with open(f"/tmp/vmsched-tests-{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="module", autouse=True)
def broker_faults_alone() -> Iterator[None]:
    """For the modules that import it: the broker-fault tests (a cut proxy, private nodes, the 3-node cluster)
    never run beside each other."""
    with exclusive("broker-faults"):
        yield
