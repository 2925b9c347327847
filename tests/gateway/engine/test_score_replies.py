"""Score replies through the real gateway and services, as the engine gets them.

A unit that scores only some hosts, and the optional per-unit triples
(``--score-per-unit``), on the all-in-one process a user starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.stack import Stack, plugin_copy, start_all_in_one

H = [f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(4)]
VM = "11111111-2222-3333-4444-555555555555"

PARTIAL = '''
class OnlyFirst:
    def do_score(self, hosts, vm, args):
        "Scores the first host only (the case that made unscored hosts win)."
        return [(hosts[0], 50)]


class Unbounded:
    def do_score(self, hosts, vm, args):
        "Scores the first host infinite and the second minus infinite."
        return [(hosts[0], float("inf")), (hosts[1], -float("inf")), (hosts[2], 3), (hosts[3], 1.5)]
'''


def _stack(tmp_path: Path, *extra: str) -> Stack:
    plugins = plugin_copy(tmp_path)
    (plugins / "partial.py").write_text(PARTIAL)
    return start_all_in_one(tmp_path, "memory://", *extra, plugins=plugins)


@pytest.fixture(scope="module")
def totals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = _stack(tmp_path_factory.mktemp("totals"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def per_unit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = _stack(tmp_path_factory.mktemp("per-unit"), "--score-per-unit")
    yield s
    s.stop()


def test_unscored_hosts_get_the_units_worst_score(totals: Stack):
    reply = totals.xmlrpc("runCostFunctions", [["OnlyFirst", 1], ["LegacyScore", 1]], H, VM, {})
    assert reply["result"] == [[h, 55] for h in H] and reply["result_code"] == 0
    r = totals.post("/v1/score", json={"units": [{"name": "OnlyFirst", "factor": 1}], "hosts": H, "vm": VM})
    assert r.json()["units"][0]["missing"] == H[1:]
    assert r.json()["result"] == [[h, 50] for h in H]


def test_an_infinite_score_costs_its_host_not_the_reply(totals: Stack):
    # JSON has no infinity: the service's reply once carried null, which the gateway refused as a malformed
    # reply, and the engine got no weights at all for any unit
    reply = totals.xmlrpc("runCostFunctions", [["Unbounded", 2], ["OnlyFirst", 1]], H, VM, {})
    assert reply["result"] == [[H[0], 56], [H[1], 56], [H[2], 56], [H[3], 53]] and not reply["errors"]
    assert list(reply["plugin_errors"]) == ["Unbounded"]
    assert "2 hosts a score that is not a finite number" in reply["plugin_errors"]["Unbounded"][0]
    r = totals.post("/v1/score", json={"units": [{"name": "Unbounded", "factor": 1}], "hosts": H, "vm": VM})
    assert r.status_code == 200 and r.json()["units"][0]["missing"] == H[:2]
    weights = dict(r.json()["result"])
    assert weights[H[0]] == weights[H[1]] == weights[H[2]] > weights[H[3]]  # the broken ones rank with the worst


def test_per_unit_triples_leave_the_factor_to_the_engine(per_unit: Stack):
    reply = per_unit.xmlrpc("runCostFunctions", [["LegacyScore", 7], ["OnlyFirst", 3]], H[:2], VM, {})
    assert reply["result"] == [[H[0], 5, "LegacyScore"], [H[1], 5, "LegacyScore"],
                               [H[0], 50, "OnlyFirst"], [H[1], 50, "OnlyFirst"]]
    failed = per_unit.xmlrpc("runCostFunctions", [["Exits", 1]], H[:2], VM, {})
    assert failed["result"] == [[H[0], 0], [H[1], 0]] and "Exits" in failed["plugin_errors"]
