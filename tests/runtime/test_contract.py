"""The plugin contract module: one table for the worker, the services and the docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vmsched.messages import Kind
from vmsched.runtime.contract import KIND, KINDS, MAX_REASON, MAX_REASONS, BadResult

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def test_every_message_kind_has_one_contract_entry() -> None:
    assert [k.kind for k in KINDS] == [k.value for k in Kind]
    assert all(KIND[kind].kind == kind.value for kind in Kind)


def test_docs_contract_table_is_the_contract() -> None:
    rows = re.findall(r"^\| `(do_\w+\(self[^`]*\))` \| `(\w+)` \|", DOCS.read_text(), re.M)
    assert rows == [(k.signature, k.operation) for k in KINDS]


def test_arguments_follow_the_signature() -> None:
    hosts, props = ["h1"], {"k": "v"}
    assert KIND["filter"].args(hosts, "vm", props) == (hosts, "vm", props)
    assert KIND["score"].args(hosts, "vm", props) == (hosts, "vm", props)
    assert KIND["balance"].args(hosts, "vm", props) == (hosts, props)


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("filter", ["a", "b"], ["a", "b"]),
        ("score", [["a", 1], ["b", 2.5]], [("a", 1.0), ("b", 2.5)]),
        ("balance", [None, ["a"]], ("", ["a"])),
        ("balance", ["vm", []], ("vm", [])),
    ],
)
def test_checks_accept_the_contract_shapes(kind: str, value: object, expected: object) -> None:
    assert KIND[kind].check(value) == expected


@pytest.mark.parametrize(
    ("kind", "value", "reason"),
    [
        ("filter", None, "returned nothing"),
        ("filter", ["a", 1], "non-string host ID"),
        ("score", [["a", True]], "is not a number"),
        ("score", [["a", float("nan")]], "NaN"),
        ("score", [["a"]], "bad score entry"),
        ("balance", ["vm"], "expected (vm_id, [host_ids])"),
        ("balance", [3, []], "expected a VM ID string"),
        ("balance", ["vm", "a"], "expected a list of host IDs"),
        ("filter", {"a": 3}, "the reason must be a string"),
        ("score", [["a", 1, ["why"]]], "the reason must be a string"),
        ("score", [["a", 1, "why", "more"]], "bad score entry"),
        ("score", [["a", 10 ** 400]], "bad score for host a: an integer too large for a float"),  # was OverflowError
        ("score", [["a", -10 ** 5000, "why"]], "bad score for host a: an integer too large for a float"),
        ("balance", ["vm", ["a"], 7], "the reason must be a string"),
        ("balance", ["vm", ["a"], "why", "more"], "expected (vm_id, [host_ids])"),
    ],
)
def test_checks_refuse_other_shapes(kind: str, value: object, reason: str) -> None:
    with pytest.raises(BadResult, match=re.escape(reason)):
        KIND[kind].check(value, ["a", "b"])


# --- reasons: optional, compatible, bounded ----------------------------------------------
def test_a_filter_may_return_reasons_for_the_hosts_it_drops() -> None:
    verdict = KIND["filter"].read({"b": "free 1.2 GiB < 4 GiB needed", "d": None, "zz": "not requested"},
                                  ["a", "b", "c", "d"])
    assert verdict.value == ["a", "c"]  # kept = requested - dropped, in the request's order
    assert verdict.reasons == {"b": "free 1.2 GiB < 4 GiB needed"}  # no text for d, nothing for a foreign ID
    assert KIND["filter"].read(["a"], ["a", "b"]).reasons == {}  # the old list: no reasons
    with pytest.raises(BadResult, match="the requested hosts are needed"):
        KIND["filter"].check({"b": "x"})


def test_score_triples_and_balance_third_element_carry_reasons() -> None:
    score = KIND["score"].read([["a", 1, "2 guests"], ["b", 2], ["x", 3, "not requested"]], ["a", "b"])
    assert score.value == [("a", 1.0), ("b", 2.0), ("x", 3.0)] and score.reasons == {"a": "2 guests"}
    text = KIND["balance"].read(["vm", ["a"], "host b is at 95 % CPU"], ["a", "b"])
    assert text.value == ("vm", ["a"]) and text.reason == "host b is at 95 % CPU" and text.reasons == {}
    per_host = KIND["balance"].read([None, [], {"a": "too busy"}], ["a"])
    assert per_host.value == ("", []) and per_host.reasons == {"a": "too busy"} and per_host.reason == ""


def test_reasons_are_bounded_and_one_line() -> None:
    hosts = [f"h{i}" for i in range(MAX_REASONS + 50)]
    verdict = KIND["filter"].read({h: "x" * 10 * MAX_REASON for h in hosts}, hosts)
    assert verdict.value == [] and len(verdict.reasons) == MAX_REASONS
    assert all(len(r) == MAX_REASON and r.endswith("...") for r in verdict.reasons.values())
    odd = KIND["filter"].read({"a": "line one\n\x1b[31mred\u2028\ud800 end"}, ["a"]).reasons["a"]
    assert odd == "line one [31mred ? end" and odd.encode("utf-8")


def test_contract_imports_only_the_standard_library() -> None:
    """The plugin worker imports it: it must not drag the service's dependencies in."""
    code = (
        "import sys; import vmsched.runtime.contract, vmsched.runtime.worker.main; "
        "print(sorted(m for m in ('pydantic', 'kombu', 'prometheus_client', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_aligned_scores_checks_the_edges() -> None:
    """The common result (exact pairs, floats or ints) is checked in C-level passes; the edges still hold."""
    from vmsched.runtime.contract import aligned_scores

    hosts = ["a", "b", "c"]
    assert aligned_scores([["a", 1.5], ("b", 2), ["c", -0.0]], hosts) == [1.5, 2.0, -0.0]
    big = [["a", 1e308], ["b", 1e308], ["c", 1.0]]  # finite numbers whose total is not
    assert aligned_scores(big, hosts) == [1e308, 1e308, 1.0]
    assert aligned_scores([], []) == []

    class Host(str):
        pass
    for value in ([["a", 1.0], ["b", float("nan")], ["c", 1.0]], [["a", 1.0], ["b", float("inf")], ["c", 1.0]],
                  [["a", True], ["b", 1.0], ["c", 1.0]], [["a", 10 ** 400], ["b", 1.0], ["c", 1.0]],
                  [[Host("a"), 1.0], ["b", 1.0], ["c", 1.0]], [["b", 1.0], ["a", 1.0], ["c", 1.0]],
                  [["a", 1.0, "why"], ["b", 1.0], ["c", 1.0]]):
        assert aligned_scores(value, hosts) is None, value
