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
from itertools import compress, filterfalse, repeat
from operator import add, floordiv, lt, mul, sub

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
    gaps = list(map(sub, distinct[1:], distinct))  # between neighbours
    nearest = gaps.index(min(gaps)) if gaps else 0
    for p, q in _scales(hi - lo, den, bound):  # scale p/q on the real values (value / den)
        qden = q * den
        if (hi - lo) * p <= (len(distinct) - 2) * qden:
            continue  # the last int is below the first + len - 1: some two would tie (see _tie)
        offset = 0 if lo >= 0 and hi * p <= bound * qden else lo
        if _int(lo - offset, p, qden) < 0 or _int(hi - offset, p, qden) > bound:
            continue
        if gaps and _tie(distinct, offset, [nearest], p, qden):
            continue  # the nearest neighbours tie (totals a rounding error apart tie at every scale in reach)
        if not _tie(distinct, offset, _close(gaps, p, qden), p, qden):
            return _mapped(values, distinct, _ints(distinct, offset, p, qden))
    return _mapped(values, distinct, range(len(distinct)))


def _int(value: int, p: int, qden: int) -> int:
    """``floor(value * p / qden + 1/2)``: rounded half up (0.5, 1.5 -> 1, 2)."""
    return (2 * value * p + qden) // (2 * qden)


def _ints(ascending: list[int], offset: int, p: int, qden: int) -> list[int]:
    shifted = ascending if offset == 0 else list(map(sub, ascending, repeat(offset)))
    return list(map(floordiv, map(add, map(mul, shifted, repeat(2 * p)), repeat(qden)), repeat(2 * qden)))


def _close(gaps: list[int], p: int, qden: int) -> list[int]:
    """The neighbours (by the index of the lower) less than one unit apart at scale ``p / qden``: the only ones that
    can get the same int (the int of the larger is otherwise at least one more)."""
    return list(compress(range(len(gaps)), map(lt, gaps, repeat(-(-qden // p)))))  # gap * p < qden


def _tie(ascending: list[int], offset: int, neighbours: Iterable[int], p: int, qden: int) -> bool:
    """Whether some of the ``neighbours`` (``i``: values ``i`` and ``i + 1``), less ``offset``, get the same int at
    scale ``p / qden``. The ints never descend as the values ascend, so only neighbours can tie, and only those
    :func:`_close`; the nearest is looked at first, so that values no scale in reach separates (totals a rounding
    error apart) cost one look per scale, not one int per value."""
    for i in neighbours:
        if _int(ascending[i] - offset, p, qden) == _int(ascending[i + 1] - offset, p, qden):
            return True
    return False


def _scales(span: int, den: int, bound: int) -> Iterable[tuple[int, int]]:
    if span > bound * den:  # too wide even unscaled: squeeze the span into the bound
        yield bound * den, span
        return
    for decade in range(_MAX_DECADES + 1):
        if span * 10**decade > bound * den:
            return
        yield 10**decade, 1


def _mapped(values: Sequence[int], distinct: list[int], ints: Iterable[int]) -> list[int]:
    return list(map(dict(zip(distinct, ints)).__getitem__, values))
