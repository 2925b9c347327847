"""Ports on the loopback interface."""

from __future__ import annotations

import itertools
import os
import random
import socket

from tests.support.rabbit_ports import SHARED_PORTS

#: Ports handed out: below the kernel's ephemeral range, so that no outgoing connection (to the broker, to a
#: gateway: thousands during a run) takes a port between its choice and its use; each pytest process (an xdist
#: worker, or the real-QEMU run) has a slice of its own, so that two never choose the same.
_LOW, _SLICE, _SLICES = 20000, 1200, 10


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % (_SLICES - 1) if worker[2:].isdigit() else _SLICES - 1  # gw0, gw1, ...; else the last
    start = _LOW + index * _SLICE
    return range(start, min(start + _SLICE, _ephemeral_start()))


_PORTS = _slice()
_NEXT = itertools.count(random.randrange(len(_PORTS)) if _PORTS else 0)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, from this process's slice."""
    for _ in range(len(_PORTS)):
        port = _PORTS[next(_NEXT) % len(_PORTS)]
        if port in SHARED_PORTS:  # the shared broker's (its distribution port is in this range)
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # something listens there (or just did)
            return port
    with socket.socket() as s:  # the slice is used up (or the ephemeral range starts below it): any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
