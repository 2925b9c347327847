"""The score rules of ENGINE-PROTOCOL.md as properties (hypothesis), on the renderer alone.

For arbitrary real scores from arbitrary units: every requested host is in
the reply once, the integers keep the order of the exact real totals (no ties,
no swaps, equal stays equal), and every weight is in [0, SCORE_BOUND].
"""

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.gateway.render import score_decision
from vmsched.gateway.scores import SCORE_BOUND, encode
from vmsched.messages import ScoreOutcome

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
