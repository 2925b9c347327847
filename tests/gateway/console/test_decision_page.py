"""A decision's page as the gateway app renders it (in process): the score page's order, ranks, ties, bars and
notes, and the filter page's result column. The browser test (tests/e2e/test_console_browser.py) shows the same
page in Chromium."""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.support.html_table import Table, table
from vmsched.decide.rules import filter_decision, score_decision
from vmsched.gateway.console import pages
from vmsched.gateway.decisions.log import DecisionLog
from vmsched.gateway.decisions.record import keep, new_id
from vmsched.messages import FilterOutcome, FilterRequest, MissingFacts, ScoreOutcome, ScoreRequest

H = [f"eeeeeeee-0000-0000-0000-00000000000{i}" for i in range(4)]
VM = "22222222-0000-0000-0000-000000000000"
MARKUP = '<b id="injected">x</b>'
NO_AGENT = "no agent reports them"


@pytest.fixture(scope="module")
def app() -> FastAPI:
    """The console's routes with a decision log of their own (the gateway app adds auth and the bus around them)."""
    app = FastAPI()
    app.include_router(pages.router)
    app.state.decisions = DecisionLog(20, "gw-a")
    return app


def _page(app: FastAPI, op: str, req: Any, decision: Any, outcomes: Any) -> str:
    """The console page of a decision put in the app's log."""
    record_id = new_id()
    kept = orjson.dumps(keep(op, req, decision, outcomes, False, 0.01))
    app.state.decisions.ring.put(op, record_id, time.time(), kept)
    r = TestClient(app).get(f"/console/decisions/{record_id}")
    assert r.status_code == 200, r.text
    assert "'unsafe-inline'" not in r.headers["content-security-policy"]
    assert "style=" not in r.text and "<style" not in r.text  # the CSP allows no inline style: the bars use none
    assert all(body == "" for body in re.findall(r"<script[^>]*>(.*?)</script>", r.text, re.S))
    return r.text


def _score(app: FastAPI, per_unit: bool = False) -> tuple[str, Table]:
    """Guests x2 and Load x1 tie H0 and H2 at 14 (H3 19, H1 30); Cpu scored no host, for want of facts."""
    outcomes = [
        ScoreOutcome(unit="Guests", ok=True, factor=2, scores=list(zip(H, [2.0, 5.0, 2.0, 7.0])),
                     reasons={H[0]: "2 guests", H[1]: MARKUP}),
        ScoreOutcome(unit="Load", ok=True, factor=1, scores=list(zip(H, [10.0, 20.0, 10.0, 5.0]))),
        ScoreOutcome(unit="Cpu", ok=True, factor=1, scores=[]),
    ]
    req = ScoreRequest.model_validate({"units": [{"name": "Guests", "factor": 2}, {"name": "Load"}, {"name": "Cpu"}],
                                       "hosts": H, "vm": VM})
    decision = score_decision(H, outcomes, per_unit=per_unit)
    decision.missing_facts = MissingFacts(units=["Cpu"], hosts={NO_AGENT: H})
    page = _page(app, "score", req, decision, outcomes)
    return page, table(page, "verdicts")


def test_the_score_page_ranks_hosts_lowest_weight_first_with_ties_totals_and_bars(app: FastAPI) -> None:
    page, verdicts = _score(app)
    assert [row[0].text for row in verdicts.rows] == [H[0], H[2], H[3], H[1]]  # vmsched's order
    total, sent, result = (verdicts.column(name) for name in ("weighted total", "weight sent", "result"))
    rows = verdicts.by_host()
    assert [rows[h][total].text for h in (H[0], H[2], H[3], H[1])] == ["14", "14", "19", "30"]
    assert [rows[h][sent].text for h in (H[0], H[2], H[3], H[1])] == ["14", "14", "19", "30"]
    assert rows[H[0]][result].text == rows[H[2]][result].text == "rank 1 tied vmsched's best"
    assert rows[H[3]][result].text == "rank 3" and rows[H[1]][result].text == "rank 4"
    assert verdicts.row_classes[:2] == [["best"], ["best"]] and verdicts.row_classes[2] == []
    guests, load, cpu = (verdicts.column(name) for name in ("Guests", "Load", "Cpu"))
    assert verdicts.head[guests] == "Guests x2 deciding" and verdicts.head[cpu] == "Cpu x1 scored no host"
    for row in verdicts.rows:  # a bar per unit that scored, and one for the total
        assert (row[guests].bars, row[load].bars, row[cpu].bars, row[total].bars) == (1, 1, 0, 1)
        assert row[cpu].text == "no score"
    assert rows[H[0]][guests].text == "2 2 guests"
    assert re.search(r'<svg class="bar deciding"[^>]*aria-label="Guests: 4"', page)  # factor x score
    assert "Deciding unit: <strong>Guests</strong>" in page  # H3 is behind H0 because of Guests: 14 vs 4
    assert f"{H[0]} ranks ahead of {H[3]}: Guests gives {H[3]} 10 more than {H[0]}" in page
    assert "<ul id=\"idle-units\"><li>Cpu scored no host (no facts): it changes no host's rank</li></ul>" in page
    assert re.search(r'id="engine-note">The engine adds its own units \(its built-in policy units\) to these '
                     r"weights, so the host it picks may differ", page)
    assert MARKUP not in page and "&lt;b id=&quot;injected&quot;&gt;x&lt;/b&gt;" in page
    assert f"best {H[0]} and {H[2]}, tied at weight 14, of 4 scored hosts: 2 of 3 units scored; Cpu scored no host " \
           "(no facts)" in page


def test_with_score_per_unit_the_page_shows_each_units_weights(app: FastAPI) -> None:
    page, verdicts = _score(app, per_unit=True)
    assert [row[0].text for row in verdicts.rows] == [H[0], H[2], H[3], H[1]]  # by the engine's sum of factor x weight
    assert "weight sent" not in verdicts.head and "[host, weight, unit]" in page
    rows = verdicts.by_host()
    guests, cpu, total = verdicts.column("Guests"), verdicts.column("Cpu"), verdicts.column("weighted total")
    assert rows[H[1]][guests].text == f"5 weight 5 {MARKUP}" and rows[H[1]][cpu].text == "no score weight 0"
    assert [rows[h][total].text for h in (H[0], H[2], H[3], H[1])] == ["14", "14", "19", "30"]
    assert rows[H[3]][verdicts.column("result")].text == "rank 3"


def test_a_unit_that_did_not_score_a_host_counts_its_worst_there(app: FastAPI) -> None:
    outcomes = [ScoreOutcome(unit="Some", ok=True, scores=[(H[0], 1.0), (H[1], 3.0)]),
                ScoreOutcome(unit="Fails", ok=False, error="boom")]
    req = ScoreRequest.model_validate({"units": [{"name": "Some"}, {"name": "Fails"}], "hosts": H[:3], "vm": VM})
    verdicts = table(_page(app, "score", req, score_decision(H[:3], outcomes), outcomes), "verdicts")
    rows = verdicts.by_host()
    some, fails, total = verdicts.column("Some"), verdicts.column("Fails"), verdicts.column("weighted total")
    assert rows[H[2]][some].text == "no score: counts as its worst" and rows[H[2]][total].text == "3"
    assert rows[H[2]][verdicts.column("result")].text == "rank 2 tied"  # with H1, at the unit's worst
    assert rows[H[0]][fails].text == "ignored" and rows[H[0]][fails].bars == 0


def test_the_filter_pages_result_column_says_kept_or_which_units_dropped_a_host_and_why(app: FastAPI) -> None:
    outcomes = [FilterOutcome(unit="Memory", ok=True, hosts=[H[0], H[2]], reasons={H[1]: "free 1 GiB < 4 GiB",
                                                                                  H[3]: MARKUP}),
                FilterOutcome(unit="AllowDeny", ok=True, hosts=[H[0], H[1], H[2]])]
    req = FilterRequest(units=["Memory", "AllowDeny"], hosts=H, vm=VM)
    page = _page(app, "filter", req, filter_decision(H, outcomes), outcomes)
    verdicts = table(page, "verdicts")
    rows, result = verdicts.by_host(), verdicts.column("result")
    assert rows[H[0]][result].text == "kept" and rows[H[2]][result].text == "kept"
    assert rows[H[1]][result].text == "dropped by Memory free 1 GiB < 4 GiB"
    assert rows[H[3]][result].text == f"dropped by Memory, AllowDeny Memory: {MARKUP}"
    assert rows[H[3]][result].classes == ["out"] and MARKUP not in page
