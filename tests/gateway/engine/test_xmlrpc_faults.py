"""What the engine is told about a call the gateway cannot run: a fault with a sentence of ours, never an exception.

Engine-shaped calls, mutated the way a broken client would (elements duplicated, dropped, renamed, moved or
wrapped, text replaced; sometimes bytes cut or spliced in), go through the gateway's XML-RPC handler, with a
scheduler on the in-process bus (no service runs: a call that passes every check gets the fallback decision
once its short deadline passes). Every answer is a methodResponse or a fault whose code says what kind of
error it is (-32700 not XML, -32600 not an XML-RPC call, -32601 no such method, -32602 wrong parameters) and
whose text is one of the gateway's sentences, with no exception class or traceback in it. Hypothesis runs
derandomized with a fixed number of examples, so the run is repeatable and bounded (a few seconds).
tests/gateway/test_hostile_input.py sends such calls to a real gateway.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import re
import xml.etree.ElementTree as ET
import xmlrpc.client as stdlib_xmlrpc
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.engine_wire import call
from vmsched.bus.inprocess import InProcessTransport
from vmsched.gateway.engine import calls, xmlrpc
from vmsched.gateway.engine.scheduler import Scheduler
from vmsched.gateway.limits import Limits

H = [f"aaaaaaaa-0000-4000-8000-00000000000{i}" for i in range(3)]
VM = "bbbbbbbb-0000-4000-8000-000000000001"

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))

#: The gateway's fault sentences, by code: each fault text starts with one of them.
METHODS = r"(discover|runFilters|runCostFunctions|runLoadBalancing|system\.listMethods)"
SENTENCES: dict[int, list[str]] = {
    xmlrpc.PARSE_ERROR: [r"empty request body: expected an XML-RPC methodCall$", r"malformed XML: "],
    xmlrpc.INVALID_REQUEST: [r"invalid XML-RPC request: "],
    xmlrpc.METHOD_NOT_FOUND: [r"unknown method .*; known: "],
    xmlrpc.INVALID_PARAMS: [
        METHODS + r" takes \d+ parameters, got \d+$",
        METHODS + r": ",  # the request model's checks and the limits, each naming the setting or field
        r"(filters|hostIDs) must be an array of strings, got ", r"(vmID|balancer) must be a string, got ",
        r"properties must be a struct, got ", r"property .+ (is the double|must be a string)",
        r"functions must be an array of \[name, factor\], got ", r"bad cost function entry ", r"bad factor ",
        r"a parameter nests arrays or structs deeper than \d+ levels$",
    ],
    xmlrpc.SERVER_ERROR: [r"discovery unavailable: "],  # discover on a bus without services
}
#: Names that must never reach the engine: Python's exceptions, those of the libraries on the path, a traceback.
INTERNALS = sorted({name for name, obj in vars(builtins).items() if isinstance(obj, type)
                    and issubclass(obj, BaseException)} | {"ExpatError", "ResponseError", "EntitiesForbidden",
                   "ExternalReferenceForbidden", "DefusedXmlException", "ValidationError", "InvalidOperation",
                   "binascii", "Traceback"})
INTERNAL = re.compile(r"\b(" + "|".join(map(re.escape, INTERNALS)) + r")\b")

BASES = [
    call("runFilters", ["KeepEven"], H, VM, {"mode": "fast"}),
    call("runFilters", ["KeepEven", "NoSuchUnit"], H[:2], None, {"a": "b"}),
    call("runCostFunctions", [["FloatScore", 2], ["LegacyScore", 1]], H, VM, {}),
    call("runLoadBalancing", "FirstHostBalance", H, {}),
    call("discover"),
]
TAGS = ["methodCall", "methodName", "params", "param", "value", "array", "data", "struct", "member", "name",
        "string", "int", "i4", "i8", "double", "boolean", "nil", "base64", "dateTime.iso8601", "fault", "foo"]
TEXTS = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12),
    st.sampled_from(["", " ", "12x", "1", "0", "2", "-7", "1e400", "nan", "aGk=", "!!", "é",
                     "20260101T00:00:00", "never", "9" * 5000, "KeepEven", "runFilters"]),
)


Answer = Callable[[bytes], "stdlib_xmlrpc.Fault | None"]


@pytest.fixture(scope="module")
def answer() -> Iterator[Answer]:
    """The gateway's answer to a body: None for a methodResponse, else its fault."""
    loop = asyncio.new_event_loop()
    bus = InProcessTransport().client("gateway")
    loop.run_until_complete(bus.start())
    scheduler = Scheduler(bus, request_timeout=0.01, limits=Limits(max_hosts=20, max_units=5, max_string=200))

    def one(body: bytes) -> stdlib_xmlrpc.Fault | None:
        reply = loop.run_until_complete(calls.handle(scheduler, body))
        try:
            stdlib_xmlrpc.loads(reply)
        except stdlib_xmlrpc.Fault as fault:
            return fault
        return None

    yield one
    loop.run_until_complete(bus.close())
    loop.close()


@st.composite
def mutated_calls(draw: Any) -> bytes:
    root = ET.fromstring(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        _mutate(draw, root)
    body = ET.tostring(root, encoding="UTF-8")
    if draw(st.integers(0, 4)) == 0:  # now and then not XML at all: cut, or random bytes spliced in
        cut = draw(st.integers(0, len(body)))
        body = body[:cut] + draw(st.binary(max_size=12)) + (body[cut:] if draw(st.booleans()) else b"")
    return body


def _mutate(draw: Any, root: ET.Element) -> None:
    parents = {child: parent for parent in root.iter() for child in parent}
    elements = list(root.iter())
    element = draw(st.sampled_from(elements))
    parent = parents.get(element)
    how = draw(st.sampled_from(["duplicate", "drop", "rename", "text", "tail", "wrap", "move", "swap"]))
    if parent is None or how == "rename":
        element.tag = draw(st.sampled_from(TAGS))
        return
    at = list(parent).index(element)
    if how == "duplicate":
        parent.insert(at + 1, copy.deepcopy(element))
    elif how == "drop":
        parent.remove(element)
    elif how == "text":
        element.text = draw(TEXTS)
    elif how == "tail":
        element.tail = draw(TEXTS)
    elif how == "wrap":
        wrapper = ET.Element(draw(st.sampled_from(TAGS)))
        parent.remove(element)
        wrapper.append(element)
        parent.insert(at, wrapper)
    elif how == "move":
        targets = [e for e in elements if element not in e.iter()]  # not into itself or what it holds
        if targets:
            target = draw(st.sampled_from(targets))
            parent.remove(element)
            target.append(element)
    elif at + 1 < len(parent):  # swap with the next sibling
        sibling = parent[at + 1]
        parent.remove(sibling)
        parent.insert(at, sibling)


def check_fault(fault: stdlib_xmlrpc.Fault) -> None:
    """The fault's code is one of the request errors, and its text one of the gateway's sentences."""
    text = fault.faultString
    assert fault.faultCode in SENTENCES, (fault.faultCode, text)
    assert any(re.match(sentence, text, re.DOTALL) for sentence in SENTENCES[fault.faultCode]), (fault.faultCode, text)
    assert not INTERNAL.search(text), text


def test_a_struct_member_with_two_values_is_an_invalid_request(answer: Answer) -> None:
    body = call("runFilters", ["KeepEven"], H, VM, {"mode": "fast"}).replace(
        b"<value>fast</value>", b"<value>fast</value><value>slow</value>")
    fault = answer(body)
    assert fault is not None and fault.faultCode == xmlrpc.INVALID_REQUEST, fault
    assert fault.faultString == "invalid XML-RPC request: <member> holds one <value>, not more"
    check_fault(fault)


def test_a_call_the_gateway_fails_on_tells_no_exception() -> None:
    scheduler = Scheduler(bus=None, request_timeout=5)  # type: ignore[arg-type]  # no bus at all: it fails inside
    reply = asyncio.run(calls.handle(scheduler, call("runFilters", ["KeepEven"], H, VM, {})))
    with pytest.raises(stdlib_xmlrpc.Fault) as raised:
        stdlib_xmlrpc.loads(reply)
    assert raised.value.faultCode == xmlrpc.INTERNAL_ERROR
    assert raised.value.faultString == "internal error: the gateway could not answer this call; its log says why"
    assert not INTERNAL.search(raised.value.faultString)


def test_mutated_calls_get_a_result_or_one_of_our_sentences(answer: Answer) -> None:
    seen: dict[int | str, int] = {}

    @FUZZ
    @given(body=mutated_calls())
    def one(body: bytes) -> None:
        fault = answer(body)
        if fault is None:
            seen["response"] = seen.get("response", 0) + 1
            return
        check_fault(fault)
        seen[fault.faultCode] = seen.get(fault.faultCode, 0) + 1

    one()
    # the mutations reached every kind of answer: results, and each kind of refusal
    assert {"response", xmlrpc.PARSE_ERROR, xmlrpc.INVALID_REQUEST, xmlrpc.METHOD_NOT_FOUND,
            xmlrpc.INVALID_PARAMS} <= set(seen), seen
