"""Choosing a process's transport, once, at start: ``memory://`` in-process, anything else RabbitMQ."""

from __future__ import annotations

from vmsched.bus.rabbitmq.broker import BrokerTransport
from vmsched.bus.options import BusOptions
from vmsched.bus.inprocess import InProcessTransport
from vmsched.bus.interface import Transport

__all__ = ["Transport", "open_transport"]


def open_transport(options: BusOptions) -> Transport:
    """The transport of ``options``' broker URL. Create it once per process and hand it to every party:
    an in-process bus joins only the parties it is handed to."""
    return InProcessTransport(options) if options.embedded else BrokerTransport(options)
