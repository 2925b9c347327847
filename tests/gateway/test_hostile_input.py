"""Hostile input gets a 4xx or an XML-RPC fault with a reason: never a bare 500 or "internal error".

The cases run against a real all-in-one process (small limits, so they are cheap
to exceed), and the parsers' rules are checked directly.
"""

from __future__ import annotations

import asyncio
import json
import xmlrpc.client as stdlib_xmlrpc
from typing import Iterator

import httpx
import pytest

from tests.support.stack import AUTH, Stack, start_all_in_one
from tests.support.engine_wire import call
from vmsched.gateway import strict_json
from vmsched.gateway.engine import calls as engine
from vmsched.gateway.engine import xmlrpc
from vmsched.gateway.limits import Limits, OverLimit
from vmsched.gateway.engine.scheduler import Scheduler
from vmsched.messages import BalanceRequest, FilterRequest, ScoreRequest

H = [f"aaaaaaaa-0000-4000-8000-00000000000{i}" for i in range(4)]
VM = "bbbbbbbb-0000-4000-8000-000000000001"
LIMITS = ("--max-hosts", "5", "--max-units", "3", "--max-string", "100")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_all_in_one(tmp_path_factory.mktemp("hostile"), "memory://", *LIMITS)
    yield s
    s.stop()


def _post_json(stack: Stack, path: str, raw: str) -> httpx.Response:
    return stack.post(path, content=raw.encode(), headers={**_auth(stack), "Content-Type": "application/json"})


def _auth(stack: Stack) -> dict[str, str]:
    """The bearer header the test stack's gateway wants."""
    return dict(AUTH)


def _fault(stack: Stack, body: bytes) -> stdlib_xmlrpc.Fault:
    r = httpx.post(stack.url + "/RPC2", content=body, headers={"Content-Type": "text/xml"}, timeout=30)
    assert r.status_code == 200
    with pytest.raises(stdlib_xmlrpc.Fault) as info:
        stdlib_xmlrpc.loads(r.content)
    assert "internal error" not in info.value.faultString
    return info.value


# --- JSON ---------------------------------------------------------------------------

SCORE_UNIT = '{"units": [{"name": "FloatScore", "factor": %s}], "hosts": ["%s"]}' % ("%s", H[0])


@pytest.mark.parametrize("path, raw, reason", [
    ("/v1/score", SCORE_UNIT % "NaN", "NaN is not a JSON value"),
    ("/v1/score", SCORE_UNIT % "Infinity", "Infinity is not a JSON value"),
    ("/v1/score", SCORE_UNIT % "-Infinity", "-Infinity is not a JSON value"),
    ("/v1/score", SCORE_UNIT % "1e400", "too large for a double"),
    ("/v1/score", SCORE_UNIT % "false", "units.0.factor: Input should be a valid integer"),
    ("/v1/score", SCORE_UNIT % "true", "units.0.factor: Input should be a valid integer"),
    ("/v1/score", SCORE_UNIT % "2.5", "units.0.factor: Input should be a valid integer"),
    ("/v1/score", SCORE_UNIT % ("1" + "0" * 400), "units.0.factor: Input should be less than or equal to 2147483647"),
    ("/v1/filter", '{"units": ["KeepEven"], "hosts": ["\\ud800"]}', "lone surrogate (U+D800)"),
    ("/v1/filter", '{"units": ["KeepEven"], "hosts": [], "properties": {"\\udc00": "x"}}', "lone surrogate (U+DC00)"),
    ("/v1/filter", '{"units": ["KeepEven"], "hosts": [], "timeout": true}', "timeout: Input should be a valid number"),
    ("/v1/filter", '{"units": ["KeepEven"], "hosts": [], "timeout": NaN}', "NaN is not a JSON value"),
    ("/v1/filter", '{"units": "KeepEven", "hosts": 5}', "hosts: Input should be a valid list"),
    ("/v1/filter", '{"units": [', "not valid JSON"),
    ("/v1/filter", "[" * 2000 + "]" * 2000, "nested deeper than 32"),
    ("/v1/balance", '{"unit": "FirstHostBalance", "hosts": [], "properties": {"a": 1e999}}', "too large"),
    ("/v1/hosts/h1/cpus", '{"dedicated_pool": "\\ud800"}', "lone surrogate"),
    ("/v1/hosts/h1/policies/g1", '{"cap_percent": NaN}', "NaN is not a JSON value"),
    ("/v1/hosts/h1/domains/g1/stop", '{"wait": Infinity, "force": true}', "Infinity is not a JSON value"),
])
def test_json_hostile_values_are_400_with_a_reason(hostile: Stack, path: str, raw: str, reason: str):
    method = "PUT" if path.endswith(("/cpus", "/g1")) else "POST"
    r = httpx.request(method, hostile.url + path, content=raw.encode(), timeout=30,
                      headers={**_auth(hostile), "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert detail["code"] == "invalid" and detail["details"]
    assert reason in detail["error"], detail


@pytest.mark.parametrize("body, reason", [
    ({"units": ["KeepEven"], "hosts": H * 2}, "hosts: 8 host IDs, more than the limit of 5 (setting max_hosts: --max-hosts"),
    ({"units": ["KeepEven"] * 4, "hosts": H}, "units: 4 units, more than the limit of 3 (setting max_units"),
    ({"units": ["KeepEven"], "hosts": ["x" * 101]}, "hosts: a string of 101 characters, longer than the limit of 100"),
    ({"units": ["KeepEven"], "hosts": H, "vm": "v" * 500}, "vm: a string of 500 characters"),
    ({"units": ["KeepEven"], "hosts": H, "properties": {"k": "p" * 101}}, "properties: a string of 101"),
])
def test_json_limits_are_400_naming_the_setting(hostile: Stack, body: dict, reason: str):
    r = hostile.post("/v1/filter", json=body)
    assert r.status_code == 400, r.text
    assert reason in r.json()["detail"]["error"]


def test_json_every_limit_is_reported_at_once(hostile: Stack):
    r = hostile.post("/v1/score", json={"units": [{"name": "u" * 200}] * 4, "hosts": H * 2})
    assert r.status_code == 400
    details = r.json()["detail"]["details"]
    assert [d.split(":")[0] for d in details] == ["hosts", "units", "units"], details


def test_json_within_limits_still_works(hostile: Stack):
    r = hostile.post("/v1/score", json={"units": [{"name": "FloatScore", "factor": 3}], "hosts": H[:3], "vm": VM})
    assert r.status_code == 200 and r.json()["result"][1] == [H[1], 1]  # a rank
    r = _post_json(hostile, "/v1/filter", '{"units": ["KeepEven"], "hosts": ["\\ud83d\\ude00"]}')  # a valid pair
    assert r.status_code == 200, r.text


def test_openapi_documents_400_not_422(hostile: Stack):
    spec = httpx.get(hostile.url + "/openapi.json", timeout=10).json()
    for path in ("/v1/filter", "/v1/score", "/v1/balance"):
        responses = spec["paths"][path]["post"]["responses"]
        assert "400" in responses and "422" not in responses, (path, responses)


# --- XML-RPC ------------------------------------------------------------------------

def _score_call(factor_xml: str, prop_xml: str = "<value>a</value>") -> bytes:
    return (f'<?xml version="1.0"?><methodCall><methodName>runCostFunctions</methodName><params>'
            f"<param><value><array><data><value><array><data><value>FloatScore</value>{factor_xml}"
            f"</data></array></value></data></array></value></param>"
            f"<param><value><array><data><value>{H[0]}</value></data></array></value></param>"
            f"<param><value>{VM}</value></param>"
            f"<param><value><struct><member><name>p</name>{prop_xml}</member></struct></value></param>"
            f"</params></methodCall>").encode()


def _nested(depth: int) -> str:
    return "<value><array><data>" * depth + "</data></array></value>" * depth


@pytest.mark.parametrize("body, code, reason", [
    (_score_call("<value><double>inf</double></value>"), xmlrpc.INVALID_PARAMS, "bad factor inf"),
    (_score_call("<value><double>-inf</double></value>"), xmlrpc.INVALID_PARAMS, "bad factor -inf"),
    (_score_call("<value><double>nan</double></value>"), xmlrpc.INVALID_PARAMS, "bad factor nan"),
    (_score_call(f"<value><int>{10**400}</int></value>"), xmlrpc.INVALID_PARAMS, "outside the engine's int32 range"),
    (_score_call("<value><boolean>0</boolean></value>"), xmlrpc.INVALID_PARAMS, "bad factor False"),
    (_score_call("<value><i4>1</i4></value>", "<value><double>nan</double></value>"), xmlrpc.INVALID_PARAMS,
     "property 'p' is the double nan"),
    (_score_call("<value><i4>1</i4></value>", _nested(3)), xmlrpc.INVALID_PARAMS, "property 'p' must be a string"),
    (_score_call("<value><i4>1</i4></value>", "<value><foo>1</foo></value>"), xmlrpc.INVALID_REQUEST,
     "<foo> is not a value type"),
    (_score_call("<value><i4>1</i4></value>", "<value><int>12x</int></value>"), xmlrpc.INVALID_REQUEST,
     "<int> must hold an integer of at most 4300 digits, got '12x'"),
    (_score_call(f"<value><int>{'9' * 5000}</int></value>"), xmlrpc.INVALID_REQUEST, "<int> must hold an integer"),
    (_score_call("<value><i4>1</i4></value>", f"<value><i4>-{'1' * 4301}</i4></value>"), xmlrpc.INVALID_REQUEST,
     "<i4> must hold an integer of at most 4300 digits"),
    (_score_call("<value><i4>1</i4></value>", "<value>" + "s" * 101 + "</value>"), xmlrpc.INVALID_PARAMS,
     "properties: a string of 101 characters, longer than the limit of 100 (setting max_string"),
    (call("runFilters", ["KeepEven"], H + H, VM, {}), xmlrpc.INVALID_PARAMS, "more than the limit of 5"),
    (call("runFilters", ["KeepEven"] * 4, H, VM, {}), xmlrpc.INVALID_PARAMS, "units: 4 units"),
    (call("runLoadBalancing", "B" * 101, H, {}), xmlrpc.INVALID_PARAMS, "units: a string of 101"),
    (f'<?xml version="1.0"?><methodCall><methodName>runFilters</methodName><params><param>{_nested(1000)}</param>'
     f"<param><value><array><data></data></array></value></param><param><value>v</value></param>"
     f"<param><value><struct></struct></value></param></params></methodCall>".encode(),
     xmlrpc.INVALID_PARAMS, "deeper than 32 levels"),
    (call("runFilters", [["x"] * 3] * 2, H, VM, {}), xmlrpc.INVALID_PARAMS, "filters must be an array of strings"),
    (call("runFilters", ["KeepEven"], H, 7, {}), xmlrpc.INVALID_PARAMS, "vmID must be a string"),
    (b"<methodCall><methodName>runFilters</methodName><params><param><value>&#xD800;</value></param>"
     b"</params></methodCall>", xmlrpc.PARSE_ERROR, "malformed XML"),
    (call("runFilters", ["KeepEven"], H, VM, {"p": "a"}).replace(b"<value>a</value>",
                                                               b"<value>a</value><value>b</value>"),
     xmlrpc.INVALID_REQUEST, "invalid XML-RPC request: <member> holds one <value>, not more"),
])
def test_xmlrpc_hostile_values_are_faults_with_a_reason(hostile: Stack, body: bytes, code: int, reason: str):
    fault = _fault(hostile, body)
    assert fault.faultCode == code and reason in fault.faultString, fault.faultString


def test_xmlrpc_within_limits_still_works(hostile: Stack):
    assert hostile.xmlrpc("runCostFunctions", [["FloatScore", 3]], H[:3], VM, {})["result"][1] == [H[1], 1]  # a rank


# --- the rules, directly ---------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [(3, 3), ("4", 4), (2.9, 2), (-(2**31), -(2**31))])
def test_factor_accepts_what_the_engine_sends(value, expected):
    assert xmlrpc.factor(value, "u") == expected


@pytest.mark.parametrize("value", [True, None, float("inf"), float("nan"), 2**31, "x", [1], {"a": 1}])
def test_factor_refuses_anything_else(value):
    with pytest.raises(xmlrpc.Fault) as info:
        xmlrpc.factor(value, "u")
    assert info.value.faultCode == xmlrpc.INVALID_PARAMS and "bad factor" in info.value.faultString


def test_shown_values_are_bounded_for_deep_and_huge_values():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert len(xmlrpc.shown(deep)) < 100
    assert len(xmlrpc.shown("x" * 1_000_000)) < 100


@pytest.mark.parametrize("model, data", [
    (ScoreRequest, {"units": [{"name": "a", "factor": False}], "hosts": []}),
    (ScoreRequest, {"units": [{"name": "a", "factor": 2**31}], "hosts": []}),
    (ScoreRequest, {"units": [{"name": "a", "factor": 1.0}], "hosts": []}),
    (FilterRequest, {"units": ["a"], "hosts": ["\ud800"]}),
    (FilterRequest, {"units": ["a"], "hosts": [], "properties": {"k": "\udfff"}}),
    (FilterRequest, {"units": ["a"], "hosts": [], "timeout": float("inf")}),
    (FilterRequest, {"units": ["a"], "hosts": [], "timeout": float("nan")}),
    (FilterRequest, {"units": ["a"], "hosts": [], "timeout": True}),
    (BalanceRequest, {"unit": "\ud800", "hosts": []}),
])
def test_request_models_are_strict(model, data):
    with pytest.raises(ValueError):
        model.model_validate(data)
    with pytest.raises(ValueError):
        model.model_validate_json(json.dumps(data, allow_nan=True))


def test_request_models_still_take_what_they_took():
    req = ScoreRequest.model_validate_json('{"units": [{"name": "a", "factor": 2}], "hosts": ["h"], "timeout": 5}')
    assert req.units[0].factor == 2 and req.timeout == 5.0
    assert FilterRequest(units=["ü✓"], hosts=["\U0001f600"]).hosts == ["\U0001f600"]


@pytest.mark.parametrize("body", [b'{"a": NaN}', b"[-Infinity]", b"[1e400]", b'["\\ud800"]', b'{"\\udfff": 1}',
                                  b"[" * 33 + b"]" * 33, b"[" * 100_000 + b"]" * 100_000, b"\xff", b'{"a": 1',
                                  b"[1" + b"0" * 5000 + b"]", b'["\xed\xa0\x80"]', '["x"]'.encode("utf-16")])
def test_strict_json_refuses(body: bytes):
    with pytest.raises(strict_json.Refused):
        strict_json.check(body)


@pytest.mark.parametrize("body", [b'{"a": 1.5e300, "b": -2, "c": "\\ud83d\\ude00", "d": "\\\\ud800"}',
                                  b"[" * 32 + b"]" * 32, b'"plain"', "[\"ünïcødé\"]".encode()])
def test_strict_json_accepts(body: bytes):
    strict_json.check(body)


def test_limits_apply_to_both_wires_in_the_scheduler():
    scheduler = Scheduler(bus=None, request_timeout=5, limits=Limits(max_hosts=2, max_units=1, max_string=10))  # type: ignore[arg-type]
    body = call("runFilters", ["a", "b"], H[:3], VM, {})
    reply = asyncio.run(engine.handle(scheduler, body))
    with pytest.raises(stdlib_xmlrpc.Fault) as info:
        stdlib_xmlrpc.loads(reply)
    assert "hosts: 3 host IDs" in info.value.faultString and "units: 2 units" in info.value.faultString
    with pytest.raises(OverLimit) as over:
        Limits(max_string=64).check(FilterRequest(units=["u"], hosts=[], properties={"k" * 65: ""}))
    assert over.value.problems == ["properties: a string of 65 characters, longer than the limit of 64 "
                                   "(setting max_string: --max-string or VMSCHED_MAX_STRING)"]
