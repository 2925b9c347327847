"""Checking what filter and score units returned, before anyone trusts it."""

from __future__ import annotations

import math
from typing import Any


class BadResult(ValueError):
    """The unit ran but its result does not have the contract's shape."""


def host_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise BadResult(f"{what} returned {_kind(value)}, expected a list of host IDs")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise BadResult(f"{what} returned a non-string host ID: {bad[0]!r}")
    return value


def score_pairs(value: Any) -> list[tuple[str, float]]:
    if not isinstance(value, list):
        raise BadResult(f"score returned {_kind(value)}, expected a list of (host, score) pairs")
    pairs: list[tuple[str, float]] = []
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise BadResult(f"bad score entry {entry!r}: expected (host ID, number)")
        score = entry[1]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise BadResult(f"bad score for host {entry[0]}: {score!r} is not a number")
        if isinstance(score, float) and math.isnan(score):
            raise BadResult(f"bad score for host {entry[0]}: NaN")
        pairs.append((entry[0], float(score)))
    return pairs


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__} ({str(value)[:80]!r})"
