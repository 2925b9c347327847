"""Balancer service: runs load-balancing units (queue vmsched.balance.v2)."""

from vmsched.services.balancer.service import BalancerService

__all__ = ["BalancerService"]
