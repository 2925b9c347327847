"""The console's what-if view through the gateway app in process: shadow comparisons (escaped), a decision's
Shadow section, and the replay reports of --whatif-reports (listed, shown, traversal and bad reports refused)."""

from __future__ import annotations

import html
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.gateway.console.test_routes import log_in
from tests.gateway.console.test_sessions import OTHER, TOKEN, write_tokens
from tests.support.shadow import HOSTS, InProcess, comparison, gateway_in_process, publish, three_users
from tests.support.stack import TEST_TOKEN
from vmsched.gateway.console import whatif

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
ESCAPED = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"


def report(**fields: Any) -> dict[str, Any]:
    """A `vmsched replay --json` report of one changed filter call (the shape of Report.data())."""
    cell = {"KeepEven": "kept", "result": "kept"}
    data: dict[str, Any] = {
        "candidate": "./candidate", "baseline": "the recorded outcomes", "change": ["MostGuests factor 3"],
        "side_by_side": False, "files": 2, "first": 1764800000.0, "last": 1764803600.0, "calls": 11, "changed": 3,
        "unknown": 1,
        "ops": {"filter": {"calls": 3, "changed": 1, "unknown": 1, "ties": 0, "change": "a filter keeps other hosts"},
                "score": {"calls": 5, "changed": 2, "unknown": 0, "ties": 1, "change": "other best-ranked hosts"},
                "balance": {"calls": 3, "changed": 0, "unknown": 0, "ties": 0, "change": "another move proposed"}},
        "ranks": {"1": 3, "2": 2},
        "units": {"KeepEven": {"baseline": {"calls": 3, "errors": 0, "timeouts": 0, "unknown": 0, "p50": None,
                                            "p99": None},
                               "candidate": {"calls": 3, "errors": 1, "timeouts": 0, "unknown": 0, "p50": 0.0002,
                                             "p99": 0.0004}}},
        "changes": [{"id": "ab" * 16, "time": 1764800100.0, "gateway": "gw-1", "op": "filter", "vm": "vm-1",
                     "status": "changed", "what": f"keeps 2 hosts (baseline 3): drops {HOSTS[1]}", "tie": False,
                     "rank": None, "unknown": [], "units": ["KeepEven"], "properties": ["password"], "omitted": [],
                     "hosts": 2,
                     "baseline": {HOSTS[0]: cell, HOSTS[1]: cell},
                     "candidate": {HOSTS[0]: cell, HOSTS[1]: {"KeepEven": f"dropped: {HOSTILE}", "result": "dropped"}}}],
        "skipped": {}, "notes": [],
    }
    data.update(fields)
    return data


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    tmp = tmp_path_factory.mktemp("whatif")
    tokens = three_users(tmp, "read, schedule")
    reports = tmp / "reports"
    reports.mkdir()
    (reports / "monday.json").write_text(json.dumps(report()))
    (reports / "broken.json").write_text('{"calls": 3, "ops": ')
    (reports / "other.json").write_text(json.dumps({"calls": "many", "ops": {}}))
    (reports / "notes.txt").write_text("not a report")
    (tmp / "secret.json").write_text(json.dumps(report(candidate="outside the folder")))
    os.symlink(tmp / "secret.json", reports / "link.json")
    with gateway_in_process(tmp, tokens, whatif_reports=reports) as g:
        g.client.headers["Authorization"] = f"Bearer {TOKEN}"  # the read role
        yield g


def test_the_page_counts_and_lists_recent_changes_escaped(gateway: InProcess) -> None:
    record_id, quiet = uuid.uuid4().hex, uuid.uuid4().hex
    publish(gateway.transport, comparison(record_id, vm=HOSTILE, what=f"drops {HOSTILE}", candidate=HOSTILE,
                                          change=[f"left out {HOSTILE}"]))
    publish(gateway.transport, comparison(quiet, status="same", rows=[]))
    gateway.wait_shadow(quiet)
    r = gateway.client.get("/console/whatif")
    assert r.status_code == 200 and "default-src 'none'" in r.headers["content-security-policy"]
    assert HOSTILE not in r.text and r.text.count(ESCAPED) >= 4  # VM, what, candidate, change
    rows = re.findall(r"<tr class=\"shadow-(\w+)\">(.*?)</tr>", r.text.split('id="shadow-table"')[1], re.S)
    assert [cls for cls, _ in rows][0] == "changed" and record_id in rows[0][1]
    assert f'href="/console/decisions/{record_id}"' in rows[0][1]
    assert quiet not in r.text  # a "same" call is counted, not listed
    counts = dict(re.findall(r"<td>(same|changed|unknown|error)</td><td>(\d+)</td>", r.text))
    assert int(counts["same"]) >= 1 and int(counts["changed"]) >= 1
    assert not re.findall(r"<script[^>]*>[^<]+</script>", r.text) and ' style="' not in r.text
    assert not re.search(r"(src|href)=\"(https?:)?//", r.text)
    only_errors = gateway.client.get("/console/whatif", params={"status": "error"}).text
    assert record_id not in only_errors


def test_the_decision_page_has_the_shadow_section(gateway: InProcess) -> None:
    vm = str(uuid.uuid4())
    record_id = gateway.decide(vm)
    assert 'id="shadow-section"' not in gateway.client.get(f"/console/decisions/{record_id}").text
    hostile_host = f"{HOSTILE}-host"
    publish(gateway.transport, comparison(record_id, vm=vm, what=f"drops {HOSTILE}", rows=[
        {"host": hostile_host, "live": {"KeepEven": "kept", f"{HOSTILE}unit": "kept", "result": "kept"},
         "candidate": {"KeepEven": f"dropped: {HOSTILE}", f"{HOSTILE}unit": "kept", "result": "dropped"}}]))
    gateway.wait_shadow(record_id)
    page = gateway.client.get(f"/console/decisions/{record_id}")
    assert page.status_code == 200 and HOSTILE not in page.text
    section = page.text.split('id="shadow-section"')[1].split("</div><h2>")[0]
    assert "changed" in section and f"drops {ESCAPED}" in section
    hosts = section.split('id="shadow-hosts"')[1]
    head = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", hosts)]
    assert head == ["host", "KeepEven", f"{HOSTILE}unit", "result"]  # result last
    cells = re.findall(r"<td[^>]*>(.*?)</td>", hosts, re.S)
    assert html.unescape(cells[0]) == hostile_host
    assert "live: kept" in cells[1] and f"candidate: dropped: {ESCAPED}" in cells[1]
    assert cells[2] == "kept"  # the same on both sides: one verdict


def test_reports_are_listed_with_a_line_for_a_bad_one(gateway: InProcess) -> None:
    page = gateway.client.get("/console/whatif").text
    listed = page.split('id="reports-table"')[1]
    names = re.findall(r'href="/console/whatif/reports/([^"]+)"', listed)
    assert sorted(names) == ["broken.json", "monday.json", "other.json"]  # no .txt, no symlink out of the folder
    monday = re.search(r"monday\.json</a></td>(.*?)</tr>", listed, re.S).group(1)  # type: ignore[union-attr]
    assert "./candidate" in monday and "<td>11</td>" in monday and "3 (filter 1 of 3, score 2 of 5, balance 0 of 3)" in monday
    broken = re.search(r"broken\.json</a></td>(.*?)</tr>", listed, re.S).group(1)  # type: ignore[union-attr]
    assert "broken.json: not JSON" in broken and "Traceback" not in page
    other = re.search(r"other\.json</a></td>(.*?)</tr>", listed, re.S).group(1)  # type: ignore[union-attr]
    assert "not a `vmsched replay --json` report: calls:" in other


def test_a_report_shows_its_changed_calls_and_unit_figures_escaped(gateway: InProcess) -> None:
    r = gateway.client.get("/console/whatif/reports/monday.json")
    assert r.status_code == 200 and HOSTILE not in r.text and ESCAPED in r.text
    assert "password" not in r.text  # property keys are not shown (values are never in a report)
    assert f'href="/console/decisions/{"ab" * 16}"' in r.text
    units = r.text.split('id="report-units"')[1].split("</table>")[0]
    assert "KeepEven" in units and "0.2 / 0.4" in units  # candidate p50 / p99, ms
    hosts = r.text.split('class="report-hosts"')[1].split("</table>")[0]
    assert "baseline: kept" in hosts and f"candidate: dropped: {ESCAPED}" in hosts


@pytest.mark.parametrize("name", ["..%2Fsecret.json", "%2E%2E%2Fsecret.json", "link.json", "notes.txt",
                                  ".hidden.json", "missing.json", "a%00.json"])
def test_report_names_outside_the_folder_are_refused(gateway: InProcess, name: str) -> None:
    r = gateway.client.get(f"/console/whatif/reports/{name}")
    assert r.status_code in (401, 404), r.status_code  # 401: a slash in the name is no console page at all
    assert "outside the folder" not in r.text and "Traceback" not in r.text


def test_a_malformed_report_is_one_line_never_a_500(gateway: InProcess) -> None:
    for name, why in (("broken.json", "broken.json: not JSON"), ("other.json", "calls:")):
        r = gateway.client.get(f"/console/whatif/reports/{name}")
        assert r.status_code == 404 and why in r.text
        assert len(re.findall(r'id="report-error"', r.text)) == 1


def test_a_report_larger_than_the_limit_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(whatif, "MAX_REPORT", 100)
    (tmp_path / "big.json").write_text(json.dumps(report()))
    with pytest.raises(whatif.ReportError, match="big.json: larger than"):
        whatif.read_report(tmp_path, "big.json")
    with pytest.raises(whatif.ReportError, match="not a report name"):
        whatif.read_report(tmp_path, "../big.json")


def test_the_pages_need_the_read_role_and_link_from_the_navigation(gateway: InProcess) -> None:
    client = gateway.client
    for path in ("/console/whatif", "/console/whatif/reports/monday.json"):
        assert client.get(path, headers={"Authorization": f"Bearer {OTHER}"}).status_code == 303  # no read role
        assert client.get(path, headers={"Authorization": ""}).status_code == 303
    assert 'href="/console/whatif"' in client.get("/").text
    client.headers.pop("Authorization")
    try:
        log_in(client)
        assert client.get("/console/whatif").status_code == 200  # a console session works there too
    finally:
        client.cookies.clear()
        client.headers["Authorization"] = f"Bearer {TOKEN}"


def test_without_a_reports_folder_the_page_says_how_to_set_one(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, ("reader", TOKEN, "read"))
    with gateway_in_process(tmp_path, tokens) as g:
        r = g.client.get("/console/whatif", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "--whatif-reports DIR" in r.text
        r = g.client.get("/console/whatif/reports/monday.json", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404 and "No reports folder" in r.text
