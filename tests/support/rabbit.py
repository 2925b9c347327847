"""The shared RabbitMQ broker of the tests, and private vhosts on it.

Private RabbitMQ nodes (users, TLS, clusters) are in :mod:`tests.support.rabbit_private`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from contextlib import contextmanager
from typing import Iterator

import pytest

#: The shared test broker; VMSCHED_TEST_RABBIT=HOST:PORT points the tests elsewhere
#: (e.g. at a closed port, to check that the fast tier never needs it).
RABBIT_HOST, _, _RABBIT_PORT = os.environ.get("VMSCHED_TEST_RABBIT", "127.0.0.1:5672").rpartition(":")
RABBIT_PORT = int(_RABBIT_PORT)
RABBIT_URL = f"amqp://guest:guest@{RABBIT_HOST}:{RABBIT_PORT}/"


def rabbit_up() -> bool:
    try:
        socket.create_connection((RABBIT_HOST, RABBIT_PORT), timeout=1).close()
        return True
    except OSError:
        return False


@contextmanager
def private_vhost(prefix: str) -> Iterator[str]:
    """A vhost of its own on the shared test broker (guest may use it), deleted after: its name."""
    if not rabbit_up():
        pytest.fail(f"RabbitMQ is not running on {RABBIT_HOST}:{RABBIT_PORT} (scripts/test starts it)")
    vhost = f"{prefix}-{uuid.uuid4().hex[:8]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
    subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
                   check=True, capture_output=True)
    try:
        yield vhost
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)
