"""The score reply's pairs and the filter reply's host IDs written at once (gateway.xmlrpc._score_pairs,
_strings): the same bytes as item by item."""

from __future__ import annotations

import xmlrpc.client as stdlib_xmlrpc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.gateway import xmlrpc

_host = st.one_of(st.uuids().map(str), st.text(max_size=12), st.sampled_from(["a&b", "<h>", "x\r", "\x00", "é"]))
_weight = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(), st.booleans(), st.floats(allow_nan=True))
_item = st.one_of(st.tuples(_host, _weight).map(list), st.tuples(_host, _weight),
                  st.lists(st.one_of(_host, _weight), max_size=3), _host, _weight, st.none())
_pairs = st.lists(st.tuples(_host, st.integers(-(2**31), 2**31 - 1)).map(list), max_size=30)


def _item_by_item(value: Any, monkeypatch: pytest.MonkeyPatch) -> bytes:
    with monkeypatch.context() as m:
        m.setattr(xmlrpc, "_score_pairs", lambda _: None)
        m.setattr(xmlrpc, "_strings", lambda _: None)
        return xmlrpc.dump_response(value)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(value=st.one_of(_pairs, st.lists(_item, max_size=8), st.builds(lambda p, i: p + [i], _pairs, _item),
                       st.lists(_host, max_size=30), st.builds(lambda h, i: h + [i], st.lists(_host, max_size=8), _item)))
def test_the_same_bytes_as_item_by_item(value: Any) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert xmlrpc.dump_response(value) == _item_by_item(value, monkeypatch)
        assert xmlrpc.dump_response({"result": value}) == _item_by_item({"result": value}, monkeypatch)


def test_plain_pairs_take_the_bulk_way_and_parse_back() -> None:
    value = [[f"8c4a5d3c-6f3e-4a6a-9a0e-{i:012d}", i * 1000 - 7] for i in range(100)]
    assert xmlrpc._score_pairs(value) is not None
    (parsed,), _ = stdlib_xmlrpc.loads(xmlrpc.dump_response(value))
    assert parsed == value


@pytest.mark.parametrize("value", [
    [["a", 1], ["b&c", 2]], [["a", 1], ["b", True]], [["a", 1], ["b", 2**31]], [["a", 1], ("b", 2)],
    [["a", 1], ["b", 2.0]], [["a", 1], ["b", 2, 3]], [["a", 1], ["\x01", 2]], [], [["a", 1], [3, 2]],
    [["a", 1], ["b\x7f", 2]], [["a", 1], ["b>", 2]], [["a", 1], ["<b", 2]], [["é", 1], ["\x85", 2]], [["é", 1], ["&", 2]]])
def test_anything_else_goes_item_by_item(value: list[Any]) -> None:
    assert xmlrpc._score_pairs(value) is None


def test_printable_host_ids_beyond_ascii_take_the_bulk_way_too() -> None:
    value = [["hôte-é", 1], ["主机", 2]]
    assert xmlrpc._score_pairs(value) is not None
    (parsed,), _ = stdlib_xmlrpc.loads(xmlrpc.dump_response(value))
    assert parsed == value


def test_plain_host_ids_take_the_bulk_way_and_parse_back() -> None:
    value = [f"8c4a5d3c-6f3e-4a6a-9a0e-{i:012d}" for i in range(100)] + ["hôte-é", "主机"]
    assert xmlrpc._strings(value) is not None
    (parsed,), _ = stdlib_xmlrpc.loads(xmlrpc.dump_response(value))
    assert parsed == value


@pytest.mark.parametrize("value", [
    ["a", "b&c"], ["a", "<b"], ["a", "b>"], ["a", "\x01"], ["a", "b\x7f"], ["a", "x\r"], ["é", "\x85"], ["a", 1],
    ["a", None], ["a", ["b"]], ["a", True]])
def test_host_ids_that_need_escaping_or_are_not_strings_go_item_by_item(value: list[Any]) -> None:
    assert xmlrpc._strings(value) is None
    (parsed,), _ = stdlib_xmlrpc.loads(xmlrpc.dump_response(value))
    assert len(parsed) == len(value)
