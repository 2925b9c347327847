"""The score rules of ENGINE-PROTOCOL.md as properties (hypothesis), on the renderer alone.

For arbitrary real scores from arbitrary units: every requested host is in
the reply once, the integers keep the order of the exact real totals (no ties,
no swaps, equal stays equal), and every weight is in [0, SCORE_BOUND].
"""

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.decide.rules import score_decision
from vmsched.decide.weights import SCORE_BOUND, _scales, common_denominator, encode, fill_worst
from vmsched.messages import ScoreOutcome, ScoreOutcomeOnBus

HOSTS = [f"00000000-0000-0000-0000-{i:012d}" for i in range(12)]

_reals = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                   st.floats(-1e3, 1e3), st.integers(-(2**40), 2**40),
                   st.sampled_from([0.5, 1.5, 2.5, 3.5, 1e-300, -1e-300, 1e308, -1e308]))


@st.composite
def _units(draw):
    hosts = draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=12, unique=True))
    outcomes = []
    for n in range(draw(st.integers(1, 4))):
        scored = draw(st.lists(st.sampled_from(hosts), unique=True))
        outcomes.append(ScoreOutcome(unit=f"u{n}", ok=draw(st.booleans() | st.just(True)),
                                     factor=draw(st.integers(-3, 100)),
                                     scores=[(h, draw(_reals)) for h in scored]))
    return hosts, outcomes


def _real_totals(hosts, outcomes):
    """The rule stated plainly: factor x score summed exactly; unscored hosts take the unit's worst."""
    totals = dict.fromkeys(hosts, Fraction(0))
    for o in outcomes:
        if not o.ok:
            continue
        given_ = {h: Fraction(s) for h, s in o.scores}
        contributions = [o.factor * v for v in given_.values()]
        worst = max(contributions) if contributions else Fraction(0)
        for h in hosts:
            totals[h] += o.factor * given_[h] if h in given_ else worst
    return totals


def _same_order(real: dict, sent: dict) -> bool:
    keys = list(real)
    return all((real[a] < real[b]) == (sent[a] < sent[b]) and (real[a] == real[b]) == (sent[a] == sent[b])
               for a in keys for b in keys)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(_units())
def test_every_host_once_order_exact_and_bounded(case):
    hosts, outcomes = case
    d = score_decision(hosts, outcomes)
    assert [h for h, _ in d.result] == hosts
    sent = {h: w for h, w in d.result}
    assert all(type(w) is int and 0 <= w <= SCORE_BOUND for w in sent.values())
    assert _same_order(_real_totals(hosts, outcomes), sent)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(_units())
def test_per_unit_triples_keep_each_units_order(case):
    hosts, outcomes = case
    d = score_decision(hosts, outcomes, per_unit=True)
    working = [o for o in outcomes if o.ok]
    if not working:
        assert d.result == [[h, 0] for h in hosts]
        return
    assert len(d.result) == len(hosts) * len(working)
    for o in working:
        sent = {h: w for h, w, unit in d.result if unit == o.unit}
        assert list(sent) == hosts and all(0 <= w <= SCORE_BOUND for w in sent.values())
        factored = _real_totals(hosts, [o])  # the engine multiplies by the factor: compare raw order
        raw = {h: v / o.factor for h, v in factored.items()} if o.factor else dict.fromkeys(hosts, 0)
        if o.factor:
            assert _same_order(raw, sent)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(st.fractions(), max_size=40), st.integers(1, 2**20))
def test_encode_keeps_exact_order_within_any_bound(values, bound):
    values = values[: bound + 1]
    den = math.lcm(1, *(v.denominator for v in values))
    ints = encode([int(v * den) for v in values], den, bound)
    assert all(0 <= i <= bound for i in ints)
    assert _same_order(dict(enumerate(values)), dict(enumerate(ints)))


def test_integers_that_fit_are_sent_unchanged():
    assert encode([0, 3, 1000, SCORE_BOUND]) == [0, 3, 1000, SCORE_BOUND]
    assert encode([0, 6, 2000], den=2) == [0, 3, 1000]


def _reference_encode(values, den=1, bound=SCORE_BOUND):
    """encode as first written: every scale tried in turn, smallest first, each int computed in a loop."""
    distinct = sorted(set(values))
    lo, hi = distinct[0], distinct[-1]
    for p, q in _scales(hi - lo, den, bound):
        offset = 0 if lo >= 0 and hi * p <= bound * q * den else lo
        ints = [(2 * (v - offset) * p + q * den) // (2 * q * den) for v in distinct]
        if 0 <= ints[0] and ints[-1] <= bound and all(a < b for a, b in zip(ints, ints[1:])):
            return [dict(zip(distinct, ints))[v] for v in values]
    return [distinct.index(v) for v in values]


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=40),
       st.sampled_from([1, 2, 10, 1024, 2**52]), st.sampled_from([SCORE_BOUND, 1000, 50, 7]))
def test_encode_picks_the_same_ints_as_trying_every_scale(values, den, bound):
    """The scales encode skips (too narrow for its distinct values) are ones that would tie: same ints."""
    values = values[: bound + 1]
    assert encode(values, den, bound) == _reference_encode(values, den, bound)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(-300, 300), st.integers(-3, 3)), min_size=1, max_size=60),
       st.sampled_from([1, 10, 1024, 2**50]), st.sampled_from([5, 10, 2**40]), st.sampled_from([SCORE_BOUND, 1000, 7]))
def test_encode_of_near_ties_is_the_same_as_trying_every_scale(values, den, unit, bound):
    """Totals on a grid (a tenth, a hundredth) with some a rounding error apart, as float scores make them: the
    closest neighbours are looked at first, and the ints are still those of every scale tried in turn."""
    totals = [(grid * den) // unit + noise for grid, noise in values][: bound + 1]
    assert encode(totals, den, bound) == _reference_encode(totals, den, bound)


def test_encode_skips_scales_too_narrow_and_keeps_the_smallest_that_separates():
    assert encode([0, 1, 3, 4], den=2) == [0, 5, 15, 20]  # 0, .5, 1.5, 2: at scale 1 the last two tie
    assert encode([5, 15, 25], den=10) == [1, 2, 3]  # 0.5, 1.5, 2.5 half up, at scale 1


def test_fill_worst_copies_a_complete_in_order_unit_and_fills_the_others():
    scored = {"a": 1, "b": 5}
    filled = fill_worst(["a", "b"], scored, 1)
    assert filled == scored and filled is not scored
    assert list(fill_worst(["b", "a"], scored, 1)) == ["b", "a"]  # the request's order, not the unit's
    assert fill_worst(["a", "b", "c"], scored, 1) == {"a": 1, "b": 5, "c": 5}
    assert fill_worst(["a", "b", "c"], scored, -1) == {"a": 1, "b": 5, "c": 1}


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(_units(), st.booleans())
def test_aligned_values_give_the_same_decision_as_pairs(case, infinite):
    """score_decision reads a unit's aligned values (paired_scores leaves them beside its pairs) without a dict
    per unit: the same result, weights and reports as from the pairs, or the pairs' path when a value is not
    finite."""
    hosts, outcomes = case
    aligned = []
    for o in outcomes:
        given_ = dict(o.scores)
        values = [float(given_.get(h, i)) for i, h in enumerate(hosts)]
        if infinite and o.ok:
            values[-1] = math.inf
        aligned.append(ScoreOutcomeOnBus(unit=o.unit, ok=o.ok, factor=o.factor, error=None if o.ok else "boom",
                                         scores=list(zip(hosts, values)), values=values))
    pairs_only = [o.model_copy(update={"values": None}) for o in aligned]
    fast, plain = score_decision(hosts, aligned), score_decision(hosts, pairs_only)
    assert (fast.result, fast.plugin_errors, fast.errors, fast.weights) == (
        plain.result, plain.plugin_errors, plain.errors, plain.weights)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(_reals.map(float), min_size=1, max_size=20), st.lists(st.integers(-3, 100), min_size=20, max_size=20))
def test_any_common_denominator_gives_the_same_weights(values, factors):
    """common_denominator's power of two makes every value an integer, and the weights are those of the smallest
    common denominator (the lcm of the values' own)."""
    den = common_denominator(values)
    assert den & (den - 1) == 0 and all((Fraction(v) * den).denominator == 1 for v in values)
    least = math.lcm(1, *(v.as_integer_ratio()[1] for v in values))
    totals = [f * Fraction(v) for f, v in zip(factors, values)]
    assert encode([int(t * den) for t in totals], den) == encode([int(t * least) for t in totals], least)
