"""Scoring service: runs filter and score units (queues vmsched.filter, vmsched.score)."""

from vmsched.services.scoring.service import ScoringService

__all__ = ["ScoringService"]
