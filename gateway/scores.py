"""Score units' real numbers, made into the integers the oVirt engine ranks as the units meant.

The engine reads ``[host, int]`` weights, lower is better, and a host missing
from a reply counts as 0, the *best* weight. Its default selector
(RankSelector) uses only the order of each unit's weights; BasicWeight sums
``factor x weight`` over its units and over the VMs of a group, in Java
``int``. So, for every reply:

* every requested host gets a weight: a host that a unit did not score gets
  that unit's *worst* contribution (the largest ``factor x score`` it gave);
* the integers keep the order of the exact real totals: different totals never
  tie or swap, equal totals stay equal (totals are summed exactly, as integers
  over the common denominator of the floats, so float rounding cannot make
  ties either);
* every weight is in ``[0, SCORE_BOUND]`` (2^20): 2048 VMs of a group at the
  bound with factor 1 still sum below 2^31 together with the engine's own
  units (which it stretches into [1, 1000]);
* magnitudes are kept where they fit: integer totals already in the bound go
  out unchanged; otherwise one common scaling (``(total - offset) x scale``,
  scale 1, 10, 100, ... or ``SCORE_BOUND / span`` when the span is too wide,
  offset 0 unless a value would fall outside the bound, then the smallest
  total; rounded half up, so 0.5, 1.5, 2.5 become 1, 2, 3) is used when it
  keeps every total distinct, smallest scale first; else dense ranks
  (0, 1, 2, ... in total order), which keep the order only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import filterfalse, repeat
from operator import add, floordiv, mul

#: Largest weight sent to the engine; weights are in [0, SCORE_BOUND].
SCORE_BOUND = 2**20
_MAX_DECADES = 12  # at most scale 10^12 is tried for narrow spans; beyond, ranks


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def common_denominator(values: Iterable[float]) -> int:
    """A ``den`` such that every value times ``den`` is an integer: a power of two (floats are dyadic).

    A float of exponent ``e`` (``math.frexp``) is an integer times ``2 ** (e - 53)``, and the smallest value that
    is not an integer has the smallest such exponent, so ``2 ** (53 - e)`` of it will do (1 if all are integers).
    Not always the smallest such ``den`` (0.5 gets 2^53, not 2): any common one gives the same weights, as
    :func:`encode` works on ``value / den``; this one is found in one C-level pass, without a ratio per value.
    """
    smallest = min(map(abs, filterfalse(float.is_integer, values)), default=None)
    return 1 if smallest is None else 1 << (53 - math.frexp(smallest)[1])


def scaled(value: float, den: int) -> int:
    """``value * den`` exactly (``den`` from :func:`common_denominator`)."""
    num, d = value.as_integer_ratio()
    return num * (den // d)


def fill_worst(hosts: Sequence[str], scored: dict[str, int], factor: int) -> dict[str, int]:
    """Scores for every host: unscored ones get the unit's worst (after its factor) score.

    With no host scored at all, every host gets 0: the unit then changes no order.
    """
    if not scored:
        return dict.fromkeys(hosts, 0)
    if len(scored) == len(hosts) and list(scored) == hosts:
        return dict(scored)  # every host scored, in order (the common case)
    worst = max(scored.values()) if factor >= 0 else min(scored.values())
    return {h: scored.get(h, worst) for h in hosts}


def encode(values: Sequence[int], den: int = 1, bound: int = SCORE_BOUND) -> list[int]:
    """Integers in ``[0, bound]`` with exactly the order of ``values / den`` (see the module doc).

    Exact integer arithmetic throughout. Needs at most ``bound + 1`` distinct
    values (the gateway's host limit is far below).
    """
    if not values:
        return []
    distinct = sorted(set(values))
    if len(distinct) > bound + 1:
        raise ValueError(f"{len(distinct)} distinct totals cannot be distinct integers in [0, {bound}]")
    lo, hi = distinct[0], distinct[-1]
    shifted = None
    for p, q in _scales(hi - lo, den, bound):  # scale p/q on the real values (value / den)
        if (hi - lo) * p <= (len(distinct) - 2) * q * den:
            continue  # the last int is below the first + len - 1: some two would tie (see _distinct_ints)
        offset = 0 if lo >= 0 and hi * p <= bound * q * den else lo
        ints = _distinct_ints(distinct if offset == 0 else shifted or (shifted := [v - lo for v in distinct]),
                              p, q * den)
        if ints is not None and 0 <= ints[0] and ints[-1] <= bound:
            return _mapped(values, distinct, ints)
    return _mapped(values, distinct, range(len(distinct)))


def _distinct_ints(ascending: list[int], p: int, qden: int) -> list[int] | None:
    """``floor(v * p / qden + 1/2)`` of each value (half up: 0.5, 1.5 -> 1, 2) when no two are equal, else None.

    The values ascend, so the ints never descend: they are strictly increasing when they are all distinct, and
    the last is below the first + (number of values - 1) when ``span x p <= (number - 2) x qden``.
    """
    ints = list(map(floordiv, map(add, map(mul, ascending, repeat(2 * p)), repeat(qden)), repeat(2 * qden)))
    return ints if len(set(ints)) == len(ints) else None


def _scales(span: int, den: int, bound: int) -> Iterable[tuple[int, int]]:
    if span > bound * den:  # too wide even unscaled: squeeze the span into the bound
        yield bound * den, span
        return
    p = 1
    for _ in range(_MAX_DECADES + 1):
        if span * p > bound * den:
            return
        yield p, 1
        p *= 10


def _mapped(values: Sequence[int], distinct: list[int], ints: Iterable[int]) -> list[int]:
    return list(map(dict(zip(distinct, ints)).__getitem__, values))
