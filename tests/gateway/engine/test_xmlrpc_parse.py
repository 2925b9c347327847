"""What the gateway's one XML-RPC parser reads from a request body, and which fault it answers."""

from __future__ import annotations

import xmlrpc.client as stdlib_xmlrpc
from typing import Any
from xml.sax.saxutils import escape

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.engine_wire import call
from vmsched.gateway.engine import xmlrpc

H1, H2 = "8c4a5d3c-6f3e-4a6a-9a0e-1d2c3b4a5f60", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


@pytest.mark.parametrize("body, expected", [
    (call("runFilters", ["HostAllowDeny", "Mem"], [H1, H2], "vm-1", {"denied_hosts": H2, "x": ""}),
     ("runFilters", (["HostAllowDeny", "Mem"], [H1, H2], "vm-1", {"denied_hosts": H2, "x": ""}))),
    (call("runCostFunctions", [["PreferredHosts", 3], ["Spread", -2]], [H1, H2], "vm-1", {}),
     ("runCostFunctions", ([["PreferredHosts", 3], ["Spread", -2]], [H1, H2], "vm-1", {}))),
    (call("runLoadBalancing", "Balancer", [H1], {"a": "b c"}), ("runLoadBalancing", ("Balancer", [H1], {"a": "b c"}))),
    (call("discover"), ("discover", ())),
    (stdlib_xmlrpc.dumps((["a", "b"], [H1], "vm", {"k": "v", "n": 7}), "runFilters").encode(),
     ("runFilters", (["a", "b"], [H1], "vm", {"k": "v", "n": 7}))),
    (call("runFilters", ["a &amp; b"], [H1], "vm", {}), ("runFilters", (["a & b"], [H1], "vm", {}))),  # a reference
    (call("runFilters", ["a"], [H1], None, {}), ("runFilters", (["a"], [H1], None, {}))),  # ex:nil
    (call("runFilters", [True], [H1], "vm", {}), ("runFilters", ([True], [H1], "vm", {}))),  # boolean
    (b'<?xml version="1.0"?><methodCall><methodName>m</methodName><params><param><value><double>1.5</double>'
     b"</value></param></params></methodCall>", ("m", (1.5,))),
    (b"<methodCall><methodName>m</methodName><params><param><value><![CDATA[x]]></value></param></params>"
     b"</methodCall>", ("m", ("x",))),
    (b"<methodCall><!-- c --><methodName>m</methodName><params></params></methodCall>", ("m", ())),
    (b"<methodCall><methodName>m</methodName><params><param><value>a\r\nb</value></param></params></methodCall>",
     ("m", ("a\nb",))),  # XML's end-of-line handling
    (b'<methodCall><methodName>m</methodName><params><param><value a="1">x</value></param></params></methodCall>',
     ("m", ("x",))),
    (b'<?xml version="1.0" encoding="ISO-8859-1"?><methodCall><methodName>m</methodName><params><param>'
     b"<value>\xe9</value></param></params></methodCall>", ("m", ("\u00e9",))),
    (b"<methodCall><methodName>m</methodName><params><param><value><int>1_0</int></value></param></params>"
     b"</methodCall>", ("m", (10,))),  # what int() reads
    (call("m", [[[[["deep"]]]]]), ("m", ([[[[["deep"]]]]],))),
])
def test_a_body_parses_to(body: bytes, expected: tuple[str, tuple[Any, ...]]) -> None:
    assert xmlrpc.parse_call(body) == expected


@pytest.mark.parametrize("body, reason", [
    (b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><methodCall><methodName>&a;</methodName></methodCall>',
     "malformed XML: entity declarations and external entities are not accepted"),
    (b"<methodCall><methodName>m</methodName><params><param><value>x\x01</value></param></params></methodCall>",
     "malformed XML: not well-formed (invalid token)"),
    (b"<methodCall><methodName>m</methodName><params><param><value>x</value></param></params></methodCall>junk",
     "malformed XML: junk after document element"),
    (b"<methodCall><methodName>m</methodName><params>", "malformed XML: no element found"),
    (b"  \n", "empty request body"),
])
def test_a_body_gets_the_parse_fault(body: bytes, reason: str) -> None:
    with pytest.raises(xmlrpc.Fault) as raised:
        xmlrpc.parse_call(body)
    assert raised.value.faultCode == xmlrpc.PARSE_ERROR
    assert raised.value.faultString.startswith(reason), raised.value.faultString


def _call(params: bytes, method: bytes = b"<methodName>m</methodName>") -> bytes:
    return b"<methodCall>" + method + b"<params>" + params + b"</params></methodCall>"


def _member(*inner: bytes) -> bytes:
    return b"<param><value><struct><member>" + b"".join(inner) + b"</member></struct></value></param>"


@pytest.mark.parametrize("body, reason", [
    (_call(_member(b"<name>k</name><value>1</value><value>2</value>")), "<member> holds one <value>, not more"),
    (_call(_member(b"<name>k</name><name>j</name><value>1</value>")), "<member> holds one <name>, not more"),
    (_call(_member(b"<name>k</name>")), "<member> has no <value>"),
    (_call(_member(b"<value>1</value>")), "holds its <name> first, then its <value>"),
    (_call(_member(b"<value>1</value><name>k</name>")), "holds its <name> first, then its <value>"),
    (_call(b"<param><value><struct><value>1</value></struct></value></param>"),
     "<value> does not belong in <struct>, which holds <member>"),
    (_call(b"<param><value>1</value><value>2</value></param>"), "<param> holds one <value>, not more"),
    (_call(b"<param></param>"), "<param> has no <value>"),
    (_call(b"<param><value><array><value>1</value></array></value></param>"),
     "<value> does not belong in <array>, which holds <data>"),
    (_call(b"<param><value><array></array></value></param>"), "<array> has no <data>"),
    (_call(b"<param><value><i4>1</i4><i4>2</i4></value></param>"), "a <value> holds one typed element or text"),
    (_call(b"<param><value>a<string>b</string></value></param>"), "a <value> holds one typed element or text"),
    (_call(b"<param><value><string>b</string>a</value></param>"), "a <value> holds one typed element or text"),
    (_call(b"<param><value><foo>1</foo></value></param>"), "<foo> is not a value type (value types: base64,"),
    (_call(b"<param><value><string><i4>1</i4></string></value></param>"), "<string> holds text only"),
    (_call(b"<param><value><int>12x</int></value></param>"), "<int> must hold an integer of at most 4300 digits, "
                                                              "got '12x'"),
    (_call(b"<param><value><int>" + b"9" * 5000 + b"</int></value></param>"), "<int> must hold an integer"),
    (_call(b"<param><value><i4>-" + b"1" * 4301 + b"</i4></value></param>"), "<i4> must hold an integer"),
    (_call(b"<param><value><double>x</double></value></param>"), "<double> must hold a number, got 'x'"),
    (_call(b"<param><value><boolean>2</boolean></value></param>"), "<boolean> must hold 0 or 1, got '2'"),
    (_call(b"<param><value><base64>\xc3\xa9</base64></value></param>"), "<base64> must hold base64 data"),
    (_call(b"<param><value><dateTime.iso8601>never</dateTime.iso8601></value></param>"),
     "<dateTime.iso8601> must hold a time as YYYYMMDDTHH:MM:SS, got 'never'"),
    (_call(b"<param><value><bigdecimal>x</bigdecimal></value></param>"), "<bigdecimal> must hold a decimal number"),
    (_call(b"text<param><value>1</value></param>"), "text 'text' in <params>, which holds elements only"),
    (_call(b"<value>1</value>"), "<value> does not belong in <params>, which holds <param>"),
    (b"<methodCall><params></params></methodCall>", "<methodCall> has no <methodName>"),
    (b"<methodCall><methodName>m</methodName><methodName>n</methodName></methodCall>",
     "<methodCall> holds one <methodName>, not more"),
    (b"<methodCall><methodName><i4>1</i4></methodName></methodCall>", "<methodName> holds text only"),
    (b"<methodCall><methodName></methodName><params></params></methodCall>", "the call's <methodName> is empty"),
    (b"<methodResponse><params></params></methodResponse>", "the document is a <methodResponse>, not a <methodCall>"),
    (b"<methodCall><fault/></methodCall>", "<fault> does not belong in <methodCall>"),
])
def test_a_well_formed_body_that_is_no_call_gets_the_invalid_request_fault(body: bytes, reason: str) -> None:
    with pytest.raises(xmlrpc.Fault) as raised:
        xmlrpc.parse_call(body)
    assert raised.value.faultCode == xmlrpc.INVALID_REQUEST
    assert raised.value.faultString.startswith("invalid XML-RPC request: ") and reason in raised.value.faultString, \
        raised.value.faultString


def _nested(depth: int) -> bytes:
    return b"<value><array><data>" * depth + b"</data></array></value>" * depth


def _one_param(value: bytes) -> bytes:
    return b"<methodCall><methodName>m</methodName><params><param>" + value + b"</param></params></methodCall>"


def test_nesting_is_counted_open_arrays_and_structs_only() -> None:
    assert xmlrpc.parse_call(_one_param(_nested(xmlrpc.MAX_DEPTH)))[1][0] is not None
    with pytest.raises(xmlrpc.Fault) as raised:
        xmlrpc.parse_call(_one_param(_nested(xmlrpc.MAX_DEPTH + 1)))
    assert raised.value.faultCode == xmlrpc.INVALID_PARAMS and "deeper than 32 levels" in raised.value.faultString
    struct = b"<value><ex:struct><member><name>k</name>" + _nested(xmlrpc.MAX_DEPTH) + b"</member></ex:struct></value>"
    with pytest.raises(xmlrpc.Fault):  # a namespaced struct counts too
        xmlrpc.parse_call(_one_param(struct))
    siblings = b"<value><array><data>" + _nested(xmlrpc.MAX_DEPTH - 1) * 100 + b"</data></array></value>"
    assert len(xmlrpc.parse_call(_one_param(siblings))[1][0]) == 100  # closed ones are counted out


def test_the_stdlib_parser_is_left_as_it_is() -> None:
    entity = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><methodResponse><params><param><value>&a;</value>' \
             b"</param></params></methodResponse>"
    assert stdlib_xmlrpc.loads(entity) == (("b",), None)  # no process-wide defusing: the gateway's own parser does it


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["", " ", "  x ", "a<b", "a&b", "]]>", "\r", "\r\n", "\t\n", "é", "\ufffe", "\x01", "1"])
_values = st.recursive(_text | st.integers(-(2**40), 2**40),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=3),
                       max_leaves=12)
_spaces = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])
_NOT_XML = set(map(chr, [*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0xFFFE, 0xFFFF]))


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


def _read_back(v: Any) -> Any:
    """What a reader gets of ``v`` written as XML text: line ends as LF (XML's end-of-line handling)."""
    if isinstance(v, str):
        return v.replace("\r\n", "\n").replace("\r", "\n")
    if isinstance(v, list):
        return [_read_back(x) for x in v]
    if isinstance(v, dict):
        return {_read_back(k): _read_back(x) for k, x in v.items()}
    return v


def _texts(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "".join(map(_texts, v))
    if isinstance(v, dict):
        return "".join(k + _texts(x) for k, x in v.items())
    return ""


@settings(max_examples=400, deadline=None)
@given(params=st.lists(_values, max_size=4), method=_text, ws=_spaces, typed=st.booleans(),
       style=st.sampled_from(["apache", "stdlib"]))
def test_what_is_written_is_read_or_refused(params: list[Any], method: str, ws: str, typed: bool,
                                                          style: str) -> None:
    if style == "stdlib":
        method = method or "m"
        try:
            body = stdlib_xmlrpc.dumps(tuple(params), escape(method)).encode()  # it writes the name as given
        except OverflowError:  # ints past i4: not sendable
            return
    else:
        ps = "".join(f"<param>{ws}{_apache(p, ws, typed)}{ws}</param>{ws}" for p in params)
        body = (f'<?xml version="1.0" encoding="UTF-8"?>{ws}<methodCall xmlns:ex="x">{ws}<methodName>{escape(method)}'
                f"</methodName>{ws}<params>{ws}{ps}</params>{ws}</methodCall>{ws}").encode()
    if _NOT_XML & set(method + _texts(params)):
        with pytest.raises(xmlrpc.Fault) as raised:
            xmlrpc.parse_call(body)
        assert raised.value.faultCode == xmlrpc.PARSE_ERROR
        return
    if not _read_back(method):
        with pytest.raises(xmlrpc.Fault) as raised:
            xmlrpc.parse_call(body)
        assert raised.value.faultCode == xmlrpc.INVALID_REQUEST and "<methodName> is empty" in raised.value.faultString
        return
    assert xmlrpc.parse_call(body) == (_read_back(method), tuple(_read_back(params)))
