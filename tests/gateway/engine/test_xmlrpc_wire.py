"""XML-RPC parsing and replies at the wire level, as the engine sends and reads them."""

import re
import xmlrpc.client as stdlib_xmlrpc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.gateway.engine import xmlrpc
from vmsched.decide.rules import clamp_int32, score_decision
from vmsched.messages import ScoreOutcome
from tests.support.engine_wire import call, read_score_result

H1, H2 = "8c4a5d3c-6f3e-4a6a-9a0e-1d2c3b4a5f60", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def test_parses_apache_style_bodies():
    body = call("runFilters", ["HostAllowDeny"], [H1, H2], "vm-1", {"denied_hosts": H2})
    assert b"<string>" not in body and b"<i4>" not in body
    method, params = xmlrpc.parse_call(body)
    assert method == "runFilters"
    assert params == (["HostAllowDeny"], [H1, H2], "vm-1", {"denied_hosts": H2})


def test_parses_ex_nil_and_i4():
    method, params = xmlrpc.parse_call(call("runCostFunctions", [["PreferredHosts", 3]], [H1], None, None))
    assert params[0] == [["PreferredHosts", 3]] and params[2] is None and params[3] is None
    assert xmlrpc.text(params[2], "vmID") == "" and xmlrpc.properties(params[3]) == {}
    assert xmlrpc.score_units(params[0]) == [{"name": "PreferredHosts", "factor": 3}]


@pytest.mark.parametrize("body, fragment", [
    (b"", "empty request body"),
    (b"<methodCall><methodName>x</methodName><params>", "malformed"),
    (b"not xml at all", "malformed"),
    (b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><methodCall><methodName>&a;</methodName></methodCall>',
     "malformed"),
])
def test_malformed_bodies_are_faults(body, fragment):
    with pytest.raises(xmlrpc.Fault) as info:
        xmlrpc.parse_call(body)
    assert info.value.faultCode == xmlrpc.PARSE_ERROR
    assert fragment in info.value.faultString.lower()


def test_reply_never_contains_nil_double_or_int64():
    value = {"result_code": 0, "result": [[H1, 1e15], [H2, -3.7], ["x", None], ("t", 2**40)], "errors": []}
    wire = xmlrpc.dump_response(value).decode()
    assert "<nil" not in wire and "<double>" not in wire
    ints = [int(x) for x in re.findall(r"<int>(-?\d+)</int>", wire)]
    assert ints and all(-(2**31) <= i < 2**31 for i in ints)
    (parsed,), _ = stdlib_xmlrpc.loads(wire)
    assert parsed["result"][0] == [H1, 2**31 - 1] and parsed["result"][1] == [H2, -4]


def test_fault_reply_is_a_real_fault():
    wire = xmlrpc.dump_fault(xmlrpc.Fault(xmlrpc.METHOD_NOT_FOUND, "unknown method 'nope'"))
    with pytest.raises(stdlib_xmlrpc.Fault) as info:
        stdlib_xmlrpc.loads(wire)
    assert info.value.faultCode == xmlrpc.METHOD_NOT_FOUND and "nope" in info.value.faultString


@pytest.mark.parametrize("value", [[("a", "b", "c")], [["a"]], ["ok", 5], [["a", "not-int"]]])
def test_bad_cost_function_entries_are_invalid_params(value):
    with pytest.raises(xmlrpc.Fault) as info:
        xmlrpc.score_units(value)
    assert info.value.faultCode == xmlrpc.INVALID_PARAMS


def test_arity_and_types_checked():
    with pytest.raises(xmlrpc.Fault, match="takes 4 parameters"):
        xmlrpc.arity((1, 2), "runFilters", 4)
    with pytest.raises(xmlrpc.Fault, match="array of strings"):
        xmlrpc.str_list([1, 2], "hostIDs")
    with pytest.raises(xmlrpc.Fault, match="struct"):
        xmlrpc.properties(["x"])


#: Reply values a bug upstream might produce: every scalar the writer must tame, nested.
_reply_values = st.recursive(
    st.one_of(st.text(), st.sampled_from(["a <b> & 'c' \"d\"", "ctl\x01\x1f", "\ud800lone", "\ufffe"]),
              st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.booleans(), st.none(), st.tuples(st.just("tuple"), st.integers(0, 99))),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=25,
)


def engine_safe(value):
    """The reply rules, stated plainly: no nil, no doubles, int32 only, tuples as arrays."""
    if value is None:
        return ""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return clamp_int32(value)
    if isinstance(value, (list, tuple)):
        return [engine_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): engine_safe(v) for k, v in value.items()}
    return str(value)


def _xml_safe(value):
    """What the engine must read back: engine_safe, with XML-invalid characters replaced."""
    if isinstance(value, str):
        return re.sub("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]", "\ufffd", value)
    if isinstance(value, list):
        return [_xml_safe(v) for v in value]
    if isinstance(value, dict):
        return {_xml_safe(k): _xml_safe(v) for k, v in value.items()}
    return value


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(result=_reply_values, error=_reply_values)
def test_reply_writer_round_trips_through_a_real_xml_parser(result, error):
    value = {"result_code": 1, "result": result, "plugin_errors": {"u": [error]}}
    wire = xmlrpc.dump_response(value)
    (parsed,), _ = stdlib_xmlrpc.loads(wire)  # expat: fails on anything that is not well-formed XML
    assert parsed == _xml_safe(engine_safe(value))
    assert b"<nil" not in wire and b"<double>" not in wire


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(body=st.one_of(st.binary(max_size=200), st.builds(
    lambda v, cut, junk: xmlrpc.dump_response(v).replace(b"methodResponse", b"methodCall")[:cut] + junk,
    _reply_values, st.integers(0, 4000), st.binary(max_size=10))))
def test_parser_answers_a_call_or_a_fault_for_any_bytes(body):
    try:
        method, params = xmlrpc.parse_call(body)
    except xmlrpc.Fault as fault:
        assert fault.faultCode in (xmlrpc.PARSE_ERROR, xmlrpc.INVALID_REQUEST, xmlrpc.INVALID_PARAMS)
        assert fault.faultString
    else:
        assert isinstance(method, str) and isinstance(params, tuple)


# --- score replies, read back as the engine reads them -----------------------------------

H4 = [f"00000000-0000-0000-0000-00000000000{i}" for i in range(1, 5)]


def _wire(decision):
    return xmlrpc.dump_response(decision.envelope())


def test_partial_scores_do_not_make_unscored_hosts_win_on_the_wire():
    # [(hosts[0], 50)] over four hosts: main sent only H4[0]; the engine gave the other three 0 (best)
    read = read_score_result(_wire(score_decision(H4, [ScoreOutcome(unit="s", ok=True, scores=[(H4[0], 50)])])), H4)
    assert {h: w for h, [(w, _)] in read.items()} == dict.fromkeys(H4, 50)
    read = read_score_result(_wire(score_decision(H4, [ScoreOutcome(unit="s", ok=True, scores=[(H4[0], 1), (H4[1], 9)])])), H4)
    weights = {h: w for h, [(w, _)] in read.items()}
    assert weights[H4[0]] < weights[H4[1]] == weights[H4[2]] == weights[H4[3]]


def test_fractional_and_huge_scores_reach_the_engine_in_order():
    for scores in ([0.5, 1.5, 2.5, 3.5], [1e300, -1e300, 1.0, 2.0], [3.0, 3.0, 1e-9, 0.0]):
        d = score_decision(H4, [ScoreOutcome(unit="s", ok=True, factor=7, scores=list(zip(H4, scores)))])
        weights = {h: w for h, [(w, _)] in read_score_result(_wire(d), H4).items()}
        for a, sa in zip(H4, scores):
            for b, sb in zip(H4, scores):
                assert (sa < sb) == (weights[a] < weights[b]) and (sa == sb) == (weights[a] == weights[b])


def test_per_unit_triples_on_the_wire():
    d = score_decision(H4[:2], [ScoreOutcome(unit="A", ok=True, factor=4, scores=[(H4[0], 2), (H4[1], 1)]),
                                ScoreOutcome(unit="B", ok=True, factor=9, scores=[(H4[1], 3)])], per_unit=True)
    wire = _wire(d)
    assert wire.count(b"<string>A</string>") == 2 and wire.count(b"<string>B</string>") == 2
    read = read_score_result(wire, H4[:2])
    assert read == {H4[0]: [(2, "A"), (3, "B")], H4[1]: [(1, "A"), (3, "B")]}  # unfactored: the engine factors
