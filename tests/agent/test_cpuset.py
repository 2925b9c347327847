"""The one CPU-set parser (vmsched/cpuset.py): libvirt's syntax, checked against a simple reference on small
inputs, and bounded on large ones: a long text is refused before it is parsed, ranges are never expanded
before they must be, and where the host is known no set is larger than the host."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched import cpuset


def reference(text: str) -> frozenset[int] | None:
    """The meaning of ``text`` by expanding every item (fine for small CPU numbers); None when invalid."""
    include: set[int] = set()
    exclude: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        neg = item.startswith("^")
        lo, sep, hi = (item[1:] if neg else item).strip().partition("-")
        lo, hi = lo.strip(), hi.strip()
        if not (lo.isascii() and lo.isdigit()) or (sep and not (hi.isascii() and hi.isdigit())):
            return None
        a = int(lo)
        b = int(hi) if sep else a
        if b < a or b > cpuset.MAX_CPU:
            return None
        (exclude if neg else include).update(range(a, b + 1))
    return frozenset(include - exclude) or None


# --- the syntax -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,cpus",
    [("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-3,^2,6", {0, 1, 3, 6}), (" 1 , 3-4 ", {1, 3, 4}), ("0-5,^1-4", {0, 5})],
)
def test_cpuset_parse(text, cpus):
    assert cpuset.parse(text) == frozenset(cpus)


@pytest.mark.parametrize(
    "text,fragment",
    [("", "empty"), ("a", "bad item"), ("3-1", "end before start"), ("0,,1", "empty item"), ("^1", "selects no CPU"),
     ("99999", "out of range"), ("-1", "bad item")],
)
def test_cpuset_errors(text, fragment):
    with pytest.raises(cpuset.CpuSetError, match=fragment):
        cpuset.parse(text)


def test_cpuset_format_and_maps():
    assert cpuset.fmt({0, 1, 2, 3, 6, 8, 9}) == "0-3,6,8-9"
    assert cpuset.fmt(set()) == ""
    assert cpuset.to_cpumap({1, 3}, 4) == (False, True, False, True)
    with pytest.raises(cpuset.CpuSetError, match="beyond the host's 4 CPUs"):
        cpuset.to_cpumap({5}, 4)


small_items = st.builds(
    lambda neg, lo, width, pad: pad + ("^" if neg else "") + pad + (str(lo) if width is None else f"{lo}{pad}-{pad}{lo + width}") + pad,
    st.booleans(), st.integers(0, 40), st.none() | st.integers(-3, 12), st.sampled_from(["", " ", "  "]))


@settings(max_examples=500, deadline=None)
@given(st.lists(small_items, min_size=1, max_size=8))
def test_parse_agrees_with_the_reference(items):
    text = ",".join(items)
    expected = reference(text)
    if expected is None:
        with pytest.raises(cpuset.CpuSetError):
            cpuset.parse(text)
        return
    assert cpuset.parse(text) == expected
    assert cpuset.normalize(text) == cpuset.fmt(expected)
    assert cpuset.count(text) == len(expected)
    found = cpuset.spans(text)
    assert all(lo <= hi for lo, hi in found) and all(a[1] + 1 < b[0] for a, b in zip(found, found[1:]))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789-^, ", max_size=24))
def test_any_text_parses_as_the_reference_says_or_is_refused(text):
    expected = reference(text)
    if expected is None:
        with pytest.raises(cpuset.CpuSetError) as exc:
            cpuset.parse(text)
        assert "\n" not in str(exc.value)
    else:
        assert cpuset.parse(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.frozensets(st.integers(0, 200), min_size=1), st.frozensets(st.integers(0, 200), min_size=1))
def test_host_bound(cpus, host):
    text = cpuset.fmt(cpus)
    assert cpuset.parse(text) == cpus  # fmt and parse are inverse
    if cpus <= host:
        assert cpuset.parse(text, host=host) == cpus
    else:
        with pytest.raises(cpuset.CpuSetError) as exc:
            cpuset.parse(text, host=host)
        gone = cpus - host  # one CPU: "CPU 5 does not exist"; several: "CPUs 5-6 do not exist"
        said = f"CPU {cpuset.fmt(gone)} does" if len(gone) == 1 else f"CPUs {cpuset.fmt(gone)} do"
        assert str(exc.value) == f"{said} not exist on this host (CPUs {cpuset.fmt(host)})"


# --- bounded ---------------------------------------------------------------------------------------------
def test_a_text_longer_than_the_limit_is_refused_before_it_is_parsed():
    huge = ",".join(["0-16383"] * 120000)  # 960 KB; every item valid
    for call in (cpuset.parse, cpuset.normalize, cpuset.count, cpuset.spans, cpuset.bounded):
        with pytest.raises(cpuset.CpuSetError) as exc:
            call(huge)
        message = str(exc.value)
        assert f"is {len(huge):,} characters long; at most {cpuset.MAX_TEXT:,} are accepted" in message
        assert "\n" not in message and len(message) < 250, message


def test_every_canonical_set_fits_the_limit():
    widest = cpuset.fmt(range(0, cpuset.MAX_CPU + 1, 2))  # no two CPUs adjacent: the longest text fmt writes
    assert len(widest) <= cpuset.MAX_TEXT
    assert cpuset.count(widest) == 8192


def test_wide_ranges_are_not_expanded():
    text = ",".join(["0-16383"] * 8191)  # within the limit: 8,191 copies of the widest range
    assert cpuset.count(text) == 16384
    assert cpuset.normalize(text) == "0-16383"
    assert cpuset.spans(text + ",^1-16382") == [(0, 0), (16383, 16383)]
    with pytest.raises(cpuset.CpuSetError, match=r"^CPUs 16-16383 do not exist on this host \(CPUs 0-15\)$"):
        cpuset.parse(text, host=frozenset(range(16)))


@pytest.mark.parametrize("text", ["9" * 5000, "1-" + "9" * 60000, "^" + "0" * 60000 + "x", " " * 60000 + "1,"])
def test_a_value_is_quoted_short_in_its_error(text):
    with pytest.raises(cpuset.CpuSetError) as exc:
        cpuset.parse(text)
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 250, str(exc.value)


def test_leading_zeros_are_numbers_like_any_other():
    assert cpuset.parse("0000000000003-005") == {3, 4, 5}
    with pytest.raises(cpuset.CpuSetError, match="out of range"):
        cpuset.parse("0000016384")
