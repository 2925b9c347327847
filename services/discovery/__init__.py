"""Discovery service: the plugin catalog (queue vmsched.discover.v2).

The catalog of plugin units, kept current while the service runs.
"""

from __future__ import annotations

from pydantic import BaseModel

from vmsched.bus.interface import Transport
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.config import Settings
from vmsched.messages import DiscoverReply, Envelope, Op
from vmsched.service import PluginService


class DiscoveryService(PluginService):
    """Analyses plugin files in a sandboxed worker; never imports them itself."""

    name = "discovery"
    runs_units = False
    QUEUES = {REQUEST_QUEUES[Op.DISCOVER]: "discover"}

    def __init__(self, settings: Settings, transport: Transport, log_plugins: bool = True) -> None:
        super().__init__(settings, transport, pool_size=1, log_plugins=log_plugins)

    def discover(self, env: Envelope) -> BaseModel:
        self.catalog.refresh()  # one scandir when nothing changed
        units = sorted(self.catalog.units(), key=lambda u: (u.kind.value, u.name))
        return DiscoverReply(units=units, load_errors=self.catalog.load_errors(),
                             confinement=dict(self.pool.sandbox) or None)
