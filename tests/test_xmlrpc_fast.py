"""The fast reader of plain engine calls reads exactly what the full (stdlib) parser reads, or declines."""

from __future__ import annotations

import xmlrpc.client as stdlib_xmlrpc
from typing import Any
from xml.sax.saxutils import escape

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine_wire import call
from vmsched.gateway import xmlrpc
from vmsched.gateway.xmlrpc_fast import DEPTH, read_call

H1, H2 = "8c4a5d3c-6f3e-4a6a-9a0e-1d2c3b4a5f60", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def full(body: bytes) -> tuple[str, tuple[Any, ...]] | str:
    try:
        method, params = xmlrpc._parse_full(body)
        return method, tuple(params)
    except xmlrpc.Fault as fault:
        return f"fault: {fault.message}"


def test_engine_calls_take_the_fast_path_with_the_same_result() -> None:
    bodies = [
        call("runFilters", ["HostAllowDeny", "Mem"], [H1, H2], "vm-1", {"denied_hosts": H2, "x": ""}),
        call("runCostFunctions", [["PreferredHosts", 3], ["Spread", -2]], [H1, H2], "vm-1", {}),
        call("runLoadBalancing", "Balancer", [H1], {"a": "b c"}),
        call("discover"),
        stdlib_xmlrpc.dumps((["a", "b"], [H1], "vm", {"k": "v", "n": 7}), "runFilters").encode(),
    ]
    for body in bodies:
        fast = read_call(body)
        assert fast is not None, body
        assert fast == full(body)
        assert xmlrpc.parse_call(body) == full(body)


@pytest.mark.parametrize("body", [
    call("runFilters", ["a &amp; b"], [H1], "vm", {}),  # a reference: the full parser decodes it
    call("runFilters", ["a"], [H1], None, {}),  # ex:nil
    call("runFilters", [True], [H1], "vm", {}),  # boolean
    b'<?xml version="1.0"?><methodCall><methodName>m</methodName><params><param><value><double>1.5</double>'
    b"</value></param></params></methodCall>",
    b"<methodCall><methodName>m</methodName><params><param><value><![CDATA[x]]></value></param></params></methodCall>",
    b"<methodCall><!-- c --><methodName>m</methodName><params></params></methodCall>",
    b"<methodCall><methodName>m</methodName><params><param><value>a\r\nb</value></param></params></methodCall>",
    b'<methodCall><methodName>m</methodName><params><param><value a="1">x</value></param></params></methodCall>',
    b'<?xml version="1.0" encoding="ISO-8859-1"?><methodCall><methodName>m</methodName><params><param>'
    b"<value>\xe9</value></param></params></methodCall>",
    b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><methodCall><methodName>&a;</methodName></methodCall>',
    b"<methodCall><methodName>m</methodName><params><param><value>x\x01</value></param></params></methodCall>",
    b"<methodCall><methodName>m</methodName><params><param><value>x</value></param></params></methodCall>junk",
    b"<methodCall><methodName>m</methodName><params><param><value><int>1_0</int></value></param></params>"
    b"</methodCall>",
    call("m", [[[[["deep"]]]]]),  # deeper than DEPTH
])
def test_other_bodies_go_to_the_full_parser(body: bytes) -> None:
    assert DEPTH == 4
    assert read_call(body) is None
    try:
        expected: Any = xmlrpc._parse_full(body)
    except xmlrpc.Fault as fault:
        with pytest.raises(xmlrpc.Fault) as raised:
            xmlrpc.parse_call(body)
        assert raised.value.message == fault.message
        return
    assert xmlrpc.parse_call(body) == (expected[0], tuple(expected[1]))


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["", " ", "  x ", "a<b", "a&b", "]]>", "\r", "\t\n", "é", "\ufffe", "\x01", "1"])
_values = st.recursive(_text | st.integers(-(2**40), 2**40),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=3),
                       max_leaves=12)
_spaces = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])


def _apache(v: Any, ws: str, typed: bool) -> str:
    if isinstance(v, int):
        return f"<value>{ws}<i4>{v}</i4>{ws}</value>"
    if isinstance(v, str):
        return f"<value><string>{escape(v)}</string>{ws}</value>" if typed else f"<value>{escape(v)}</value>"
    if isinstance(v, list):
        return (f"<value>{ws}<array>{ws}<data>{ws}" + ws.join(_apache(x, ws, typed) for x in v)
                + f"{ws}</data>{ws}</array>{ws}</value>")
    members = "".join(f"<member>{ws}<name>{escape(k)}</name>{ws}{_apache(x, ws, typed)}{ws}</member>{ws}"
                      for k, x in v.items())
    return f"<value>{ws}<struct>{ws}{members}</struct>{ws}</value>"


@settings(max_examples=400, deadline=None)
@given(params=st.lists(_values, max_size=4), method=_text, ws=_spaces, typed=st.booleans(),
       style=st.sampled_from(["apache", "stdlib"]))
def test_whatever_the_fast_path_reads_equals_the_full_parse(params: list[Any], method: str, ws: str, typed: bool,
                                                             style: str) -> None:
    if style == "stdlib":
        try:
            body = stdlib_xmlrpc.dumps(tuple(params), method or "m").encode()
        except OverflowError:  # ints past i8: not sendable
            return
    else:
        ps = "".join(f"<param>{ws}{_apache(p, ws, typed)}{ws}</param>{ws}" for p in params)
        body = (f'<?xml version="1.0" encoding="UTF-8"?>{ws}<methodCall xmlns:ex="x">{ws}<methodName>{escape(method)}'
                f"</methodName>{ws}<params>{ws}{ps}</params>{ws}</methodCall>{ws}").encode()
    fast = read_call(body)
    if fast is not None:
        assert fast == full(body)
