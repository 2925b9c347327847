"""Balancer service: runs load-balancing units (queue vmsched.balance)."""

from services.balancer.service import BalancerService

__all__ = ["BalancerService"]
