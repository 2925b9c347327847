"""Counts in the agent's words: ``plural(1, "guest")`` is ``"1 guest"``, ``plural(2, "guest")`` ``"2 guests"``."""

from __future__ import annotations


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, with an ``s`` unless ``n`` is 1 (every noun the agent counts takes one)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
