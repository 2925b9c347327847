"""The plugin contract module: one table for the worker, the services and the docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vmsched.messages import Kind
from vmsched.runtime.contract import KIND, KINDS, BadResult

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


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
    ],
)
def test_checks_refuse_other_shapes(kind: str, value: object, reason: str) -> None:
    with pytest.raises(BadResult, match=re.escape(reason)):
        KIND[kind].check(value)


def test_contract_imports_only_the_standard_library() -> None:
    """The plugin worker imports it: it must not drag the service's dependencies in."""
    code = (
        "import sys; import vmsched.runtime.contract, vmsched.runtime.worker; "
        "print(sorted(m for m in ('pydantic', 'kombu', 'prometheus_client', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
