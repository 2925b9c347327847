"""A score decision read back from its record: the hosts in vmsched's order, each unit's part, idle units.

The weights are the ones the engine was sent (the record's ``result``): ``[host, weight]`` pairs, or with
``--score-per-unit`` ``[host, weight, unit]`` triples, which the engine multiplies by each unit's factor and
sums. Lower is better. The summary (:mod:`summary`) and the console's score page read the record through here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vmsched.decide.weights import fill_worst

NO_FACTS = "no facts"


@dataclass(frozen=True)
class Place:
    """One host's place among the weights sent."""

    host: str
    #: the weight sent; sent per unit, the sum of factor x weight that the engine makes of them
    weight: int
    #: 1 for the lowest weight; tied hosts share a rank, and the next one counts them (1, 1, 3)
    rank: int
    #: how many other hosts have the same weight
    tied: int = 0
    #: sent per unit: each unit's weight of this host; else empty
    sent: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Lead:
    """The unit that puts the best host ahead of the next one: the largest part of the difference."""

    unit: str
    best: Place
    next: Place
    by: float  # the unit's part of the next host's total minus its part of the best's


def _rows(record: dict[str, Any]) -> list[list[Any]]:
    result = record.get("result")
    return [r for r in result if isinstance(r, list) and len(r) in (2, 3)] if isinstance(result, list) else []


def per_unit(record: dict[str, Any]) -> bool:
    """Whether the weights went to the engine per unit (``[host, weight, unit]``)."""
    return any(len(r) == 3 for r in _rows(record))


def places(record: dict[str, Any]) -> list[Place]:
    """Every host the engine was sent a weight for, lowest weight first (equal weights in the engine's order)."""
    weights: dict[str, int] = {}
    sent: dict[str, dict[str, int]] = {}
    factors = {u["unit"]: u.get("factor", 1) for u in record["units"]}
    for row in _rows(record):
        if len(row) == 3:
            host, weight, unit = row
            sent.setdefault(host, {})[unit] = weight
            weights[host] = weights.get(host, 0) + factors.get(unit, 1) * weight
        else:
            weights[row[0]] = row[1]
    ordered = sorted(weights.items(), key=lambda item: item[1])  # stable: ties stay in the engine's order
    same = Counter(weights.values())
    out, rank, previous = [], 0, None
    for i, (host, weight) in enumerate(ordered, 1):
        if weight != previous:
            rank, previous = i, weight
        out.append(Place(host, weight, rank, same[weight] - 1, sent.get(host, {})))
    return out


def parts(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each working unit's part of each host's weighted total: factor x its score, a host it did not score
    getting its worst (:func:`vmsched.decide.weights.fill_worst`, as the engine's weights were made); sent per
    unit, factor x the weight sent for it. A host's parts add up to its weighted total."""
    hosts = list(dict.fromkeys(record["hosts"]))
    asked = set(hosts)
    rows = _rows(record)
    split = per_unit(record)
    out: dict[str, dict[str, float]] = {}
    for u in record["units"]:
        if not u["ok"] or "scores" not in u:
            continue
        factor = u.get("factor", 1)
        if split:
            values: dict[str, float] = {r[0]: r[1] for r in rows if len(r) == 3 and r[2] == u["unit"]}
        else:  # a non-finite score is kept as None: that host gets the unit's worst, as in the decision
            scored = {h: s for h, s in u["scores"].items() if h in asked and s is not None}
            values = fill_worst(hosts, scored, factor)
        out[u["unit"]] = {h: factor * v for h, v in values.items()}
    return out


def idle(record: dict[str, Any]) -> dict[str, str]:
    """The working units that scored no host asked for, and why (they change no order)."""
    asked = set(record["hosts"])
    missing = record.get("missing_facts") or {}
    lacking = set(missing.get("units") or []) if missing.get("hosts") else set()
    out = {}
    for u in record["units"]:
        if not u["ok"] or "scores" not in u:
            continue
        scores = u["scores"]
        mine = [s for h, s in scores.items() if h in asked]
        if any(s is not None for s in mine):
            continue
        if u["unit"] in lacking:
            out[u["unit"]] = NO_FACTS
        elif mine:
            out[u["unit"]] = "no finite score"
        elif scores:
            out[u["unit"]] = "only hosts not asked for"
        else:
            out[u["unit"]] = "no scores returned"
    return out


def lead(ranked: list[Place], shares: dict[str, dict[str, float]]) -> Lead | None:
    """The deciding unit: of the units' parts, the one that most separates the best host from the next host
    of a higher weight (None without such a host, or when no unit favours the best one)."""
    if not ranked:
        return None
    best = ranked[0]
    following = next((p for p in ranked if p.rank > best.rank), None)
    if following is None:
        return None
    gains = {unit: values.get(following.host, 0.0) - values.get(best.host, 0.0) for unit, values in shares.items()}
    unit = max(gains, key=lambda name: gains[name], default=None)
    if unit is None or gains[unit] <= 0:
        return None
    return Lead(unit, best, following, gains[unit])
