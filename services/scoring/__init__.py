"""Scoring service: runs filter and score units (queues vmsched.filter.v2, vmsched.score.v2)."""

from vmsched.services.scoring.service import ScoringService

__all__ = ["ScoringService"]
