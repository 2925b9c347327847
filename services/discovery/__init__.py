"""Discovery service: the plugin catalog (queue vmsched.discover.v2)."""

from vmsched.services.discovery.service import DiscoveryService

__all__ = ["DiscoveryService"]
