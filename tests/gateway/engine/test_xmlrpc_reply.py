"""What the gateway's XML-RPC writer sends: every reply parses back, with the engine-safe changes only."""

from __future__ import annotations

import re
import xmlrpc.client as stdlib_xmlrpc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.gateway.engine import xmlrpc
from vmsched.decide.rules import clamp_int32

_host = st.one_of(st.uuids().map(str), st.text(max_size=12), st.sampled_from(["a&b", "<h>", "x\r", "\x00", "é"]))
_weight = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(), st.booleans(), st.floats(allow_nan=True))
_item = st.one_of(st.tuples(_host, _weight).map(list), st.tuples(_host, _weight),
                  st.lists(st.one_of(_host, _weight), max_size=3), _host, _weight, st.none())
_pairs = st.lists(st.tuples(_host, st.integers(-(2**31), 2**31 - 1)).map(list), max_size=30)
#: characters XML 1.0 cannot carry: the writer sends U+FFFD instead
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _read_back(value: Any) -> Any:
    """What the engine reads of ``value``: strings without what XML cannot carry, numbers as clamped int32, None
    as "", tuples as arrays."""
    if isinstance(value, str):
        return _NOT_XML.sub("\ufffd", value)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return clamp_int32(value)
    if isinstance(value, (list, tuple)):
        return [_read_back(v) for v in value]
    if isinstance(value, dict):
        return {_read_back(str(k)): _read_back(v) for k, v in value.items()}
    return "" if value is None else _read_back(str(value))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(value=st.one_of(_pairs, st.lists(_item, max_size=8), st.builds(lambda p, i: p + [i], _pairs, _item),
                       st.lists(_host, max_size=30), st.builds(lambda h, i: h + [i], st.lists(_host, max_size=8), _item)))
def test_a_reply_parses_back_as_the_engine_reads_it(value: Any) -> None:
    for sent in (value, {"result": value, "plugin_errors": {"u": ["a<b&c\r"]}}):
        (parsed,), _ = stdlib_xmlrpc.loads(xmlrpc.dump_response(sent))
        assert parsed == _read_back(sent)


def test_score_pairs_parse_back() -> None:
    value = [[f"8c4a5d3c-6f3e-4a6a-9a0e-{i:012d}", i * 1000 - 7] for i in range(100)] + [["hôte-é", 1], ["主机", 2]]
    (parsed,), _ = stdlib_xmlrpc.loads(xmlrpc.dump_response(value))
    assert parsed == value


@pytest.mark.parametrize("value, expected", [
    ([["a", 1], ["b&c", 2]], [["a", 1], ["b&c", 2]]), ([["a", 1], ["b", True]], [["a", 1], ["b", True]]),
    ([["a", 1], ["b", 2**31]], [["a", 1], ["b", 2**31 - 1]]), ([["a", 1], ("b", 2)], [["a", 1], ["b", 2]]),
    ([["a", 1], ["b", 2.0]], [["a", 1], ["b", 2]]), ([["a", 1], ["\x01", 2]], [["a", 1], ["\ufffd", 2]]),
    ([], []), ([["a", 1], ["b\x7f", 2]], [["a", 1], ["b\x7f", 2]]), ([["a", 1], ["<b>", 2]], [["a", 1], ["<b>", 2]]),
    ([["é", 1], ["\x85", 2]], [["é", 1], ["\x85", 2]]), (["a", "x\r"], ["a", "x\r"]), (["a", None], ["a", ""]),
    (["a", float("nan")], ["a", 0]), (["a", -(2**40)], ["a", -(2**31)]),
])
def test_values_that_need_escaping_or_clamping(value: list[Any], expected: list[Any]) -> None:
    (parsed,), _ = stdlib_xmlrpc.loads(xmlrpc.dump_response(value))
    assert parsed == expected
