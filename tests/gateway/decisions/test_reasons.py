"""Reasons units give per host, end to end on a real all-in-one process.

A filter returns ``{host: reason}`` for the hosts it drops, a score unit
``(host, score, reason)`` triples, a balance unit a third element: the reasons
reach the decision record, its summary, the JSON API and the console (escaped),
and never the engine's XML-RPC reply.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import httpx
import pytest

from tests.support.stack import Stack, console_login, plugin_copy, start_all_in_one
from tests.support.waiting import wait_until
from tests.support.engine_wire import call

H = [f"dddddddd-0000-0000-0000-00000000000{i}" for i in range(4)]
MARKUP = '<b id="injected">bold</b> & "quoted"'

PLUGIN = f'''
class DropsWithReason:
    """Drops the second host for memory and the last one with markup in its reason."""

    def do_filter(self, hosts, vm, args):
        return {{hosts[1]: "free 1.2 GiB < 4 GiB needed", hosts[-1]: {MARKUP + chr(10) + "second line"!r},
                 "not-a-requested-host": "ignored"}}


class KeepsAll:
    def do_filter(self, hosts, vm, args):
        return hosts


class ScoresWithReason:
    def do_score(self, hosts, vm, args):
        return [(h, i, f"{{i}} guests running") for i, h in enumerate(hosts)]


class BalancesWithReason:
    def do_balance(self, hosts, args):
        return ("11111111-0000-0000-0000-000000000000", hosts[:1], "the source host is at 95 % CPU")
'''


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("reasons")
    plugins = plugin_copy(tmp)
    (plugins / "with_reasons.py").write_text(PLUGIN)  # before the start: every service loads it as it starts
    s = start_all_in_one(tmp, "memory://", plugins=plugins)
    wait_until(lambda: "DropsWithReason" in {u["name"] for u in s.get("/v1/units").json()["units"]}, 30, 0.2,
               "the plugin with reasons loaded")
    yield s
    s.stop()


def _engine(stack: Stack, method: str, *params: Any) -> bytes:
    """The raw XML-RPC reply, as the engine reads it."""
    r = httpx.post(stack.url + "/", content=call(method, *params), headers={"Content-Type": "text/xml"}, timeout=60)
    r.raise_for_status()
    return r.content


def _decision(stack: Stack, vm: str, op: str) -> dict[str, Any]:
    def found() -> list[dict[str, Any]]:
        return stack.get("/v1/decisions", params={"vm": vm, "op": op}).json()["decisions"]

    try:
        wait_until(lambda: len(found()) == 1, 10, 0.05, f"the {op} decision in the log")
    except AssertionError as exc:  # say what the log holds for this operation instead
        held = stack.get("/v1/decisions", params={"op": op}).json()["decisions"]
        raise AssertionError(f"{exc}; the {op} decisions held: {held}") from None
    return stack.get(f"/v1/decisions/{found()[0]['id']}").json()


def test_filter_reasons_reach_the_record_api_and_console_but_not_the_engine(stack: Stack) -> None:
    vm = str(uuid.uuid4())
    reply = _engine(stack, "runFilters", ["DropsWithReason", "KeepsAll"], H, vm, {})
    assert H[0].encode() in reply and H[1].encode() not in reply
    assert b"GiB" not in reply and b"bold" not in reply and b"second line" not in reply

    record = _decision(stack, vm, "filter")
    unit = record["units"][0]
    assert unit["dropped"] == [H[1], H[3]] and record["result"] == [H[0], H[2]]
    assert unit["reasons"] == {H[1]: "free 1.2 GiB < 4 GiB needed", H[3]: MARKUP + " second line"}
    assert record["summary"] == (f"kept 2 of 4 hosts: DropsWithReason dropped 2 ({H[1]}: free 1.2 GiB < 4 GiB "
                                 f"needed; {H[3]}: {MARKUP} second line)")

    api = stack.post("/v1/filter", json={"units": ["DropsWithReason"], "hosts": H[:3], "vm": vm}).json()
    assert api["units"][0]["reasons"][H[1]] == "free 1.2 GiB < 4 GiB needed" and api["result"] == [H[0]]

    with httpx.Client(base_url=stack.url, timeout=30) as browser:
        assert console_login(browser).status_code == 303
        page = browser.get(f"/console/decisions/{record['id']}").text
    assert '<div class="reason">free 1.2 GiB &lt; 4 GiB needed</div>' in page
    assert "&lt;b id=&quot;injected&quot;&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;" in page
    assert 'id="injected"' not in page


def test_score_and_balance_reasons(stack: Stack) -> None:
    vm = str(uuid.uuid4())
    reply = _engine(stack, "runCostFunctions", [["ScoresWithReason", 1]], H[:3], vm, {})
    assert b"guests running" not in reply
    record = _decision(stack, vm, "score")
    assert record["units"][0]["reasons"] == {h: f"{i} guests running" for i, h in enumerate(H[:3])}
    assert record["summary"].endswith(f"ScoresWithReason on {H[0]}: 0 guests running")  # lowest weight: best

    reply = _engine(stack, "runLoadBalancing", "BalancesWithReason", H[:2], {})
    assert b"95 %" not in reply
    moved = "11111111-0000-0000-0000-000000000000"
    record = _decision(stack, moved, "balance")
    assert record["units"][0]["reason"] == "the source host is at 95 % CPU"
    assert record["summary"] == (f"BalancesWithReason proposes migrating VM {moved} to one of 1 hosts ({H[0]}): "
                                 "the source host is at 95 % CPU")
