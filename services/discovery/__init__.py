"""Discovery service: the plugin catalog (queue vmsched.discover)."""

from vmsched.services.discovery.service import DiscoveryService

__all__ = ["DiscoveryService"]
