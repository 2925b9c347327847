"""Ports for private RabbitMQ nodes (:mod:`tests.support.rabbit_private`): held until the node listens, and read from a
node's log when one was in use all the same."""

from __future__ import annotations

import re
import socket


#: Where rabbitmqctl and the other CLI tools listen for Erlang distribution (rabbitmq-env: the first free port of
#: RABBITMQ_CTL_DIST_PORT_MIN..MAX): inside Linux's ephemeral range, so never a node's port; and the shared ports.
CTL_DIST_PORTS = range(35672, 35682 + 1)
SHARED_PORTS = frozenset({4369, 5671, 5672, 15672, 25672})


def hold_port(avoid: frozenset[int] | set[int] = frozenset()) -> socket.socket:
    """A socket bound (SO_REUSEADDR, not listening) to a free port of 127.0.0.1 that is not in ``avoid``,
    CTL_DIST_PORTS or SHARED_PORTS. While held, the kernel gives the port to no other bind to port 0 nor outgoing
    connection, yet a node can listen on it (RabbitMQ's listeners set SO_REUSEADDR too): close it once it does."""
    rejected: list[socket.socket] = []
    try:
        for _ in range(100):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] not in avoid | SHARED_PORTS and s.getsockname()[1] not in CTL_DIST_PORTS:
                return s
            rejected.append(s)  # kept bound meanwhile, so the kernel does not offer it again
    finally:
        for s in rejected:
            s.close()
    raise RuntimeError("no free port for a private RabbitMQ node in 100 tries")


#: How RabbitMQ 3.10's log says a port of its own was in use: the distribution port (prelaunch check), a listener.
PORT_IN_USE = (re.compile(r"dist_port_already_used,(\d+)"),
               re.compile(r"listen_error,\{acceptor,\{[\d,]+\},(\d+)\},eaddrinuse"))


def ports_in_use(log: str, ports: dict[str, int | None]) -> set[str]:
    """Which of ``ports`` (field name -> port) the node's log says were in use."""
    named = {int(m.group(1)) for pattern in PORT_IN_USE for m in pattern.finditer(log)}
    return {name for name, port in ports.items() if port in named}


class PortInUse(RuntimeError):
    """A private node exited while starting because one of its own ports was in use (its log says so)."""

    def __init__(self, message: str, why: str, fields: set[str]) -> None:
        super().__init__(message)
        self.why, self.fields = why, fields
