"""The quick start (the all-in-one, stock units, no agent): every answer says which hosts had no facts and why.

The JSON reply carries ``missing_facts``, the decision's summary counts the hosts and names the cause, the
console's decision page lists them; the engine's XML-RPC envelope stays as the engine reads it. The stock
dedicated-CPU filter, which cannot know the VM's need without facts, fails in one log line, never a traceback.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support.paths import ROOT
from tests.support.stack import Stack, console_login, start_all_in_one
from tests.support.waiting import wait_until

HOSTS = [f"dddddddd-0000-0000-0000-00000000000{i}" for i in range(3)]
UNITS = ["vmsched_Memory", "vmsched_DedicatedCpus"]
CAUSE = "no agent reports them"


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("missing-facts")
    plugins = tmp / "plugins"
    shutil.copytree(ROOT / "plugins", plugins, ignore=shutil.ignore_patterns("__pycache__"))  # the stock units
    stack = start_all_in_one(tmp, "memory://", plugins=plugins)
    yield stack
    stack.stop()


def test_the_json_reply_says_which_hosts_had_no_facts_and_why(quick_start: Stack) -> None:
    vm = str(uuid.uuid4())
    answer = quick_start.post("/v1/filter", json={"units": UNITS, "hosts": HOSTS, "vm": vm}).json()
    assert answer["result"] == HOSTS, "without facts the stock filters keep every host"
    missing = answer["missing_facts"]
    assert missing["units"] == UNITS and missing["hosts"] == {CAUSE: HOSTS}
    assert vm in missing["vm"] and "runs on no host with facts" in missing["vm"]
    assert list(answer["plugin_errors"]) == ["vmsched_DedicatedCpus"]
    (error,) = answer["plugin_errors"]["vmsched_DedicatedCpus"]
    assert error.startswith(f"dedicated CPUs of VM {vm} unknown") and "Error" not in error, "its message alone"
    score = quick_start.post("/v1/score", json={"units": [{"name": "vmsched_TargetLoadPacking", "factor": 1}],
                                                "hosts": HOSTS, "vm": vm}).json()
    assert score["missing_facts"]["hosts"] == {CAUSE: HOSTS}
    plain = quick_start.post("/v1/filter", json={"units": ["HostAllowDeny"], "hosts": HOSTS, "vm": vm}).json()
    assert plain["missing_facts"] is None, "a unit that reads no facts lacks none"


def test_the_engine_gets_its_envelope_and_the_summary_and_console_say_why(quick_start: Stack) -> None:
    vm = str(uuid.uuid4())
    sent = quick_start.xmlrpc("runFilters", UNITS, HOSTS, vm, {})
    assert set(sent) == {"result_code", "result", "plugin_errors", "errors"}, "nothing the engine would reject"
    assert sent["result"] == HOSTS and sent["result_code"] == 1

    def decision() -> dict | None:
        found = quick_start.get("/v1/decisions", params={"vm": vm}).json()["decisions"]
        return found[0] if found else None

    record = wait_until(decision, 10, 0.1, "the decision")
    assert record["summary"].startswith("kept 3 of 3 hosts: vmsched_DedicatedCpus failed (dedicated CPUs of VM")
    assert record["summary"].endswith(f"; no facts for 3 of 3 hosts ({CAUSE}) for {', '.join(UNITS)}")
    assert record["missing_facts"]["hosts"] == {CAUSE: HOSTS}
    with httpx.Client(base_url=quick_start.url, timeout=30) as browser:
        assert console_login(browser).status_code == 303
        page = browser.get(f"/console/decisions/{record['id']}").text
        listed = browser.get("/", params={"vm": vm}).text
    section = re.search(r'<div id="missing-facts">(.*?)</div>', page, re.S)
    assert section and "3 of 3 hosts had none" in section.group(1) and f"3 hosts: {CAUSE}" in section.group(1)
    assert f"no facts for 3 of 3 hosts ({CAUSE})" in listed


def test_an_expected_unit_failure_is_one_log_line_never_a_traceback(quick_start: Stack) -> None:
    log = quick_start.procs[0].log
    before = log.read_text(errors="replace")
    calls = 3
    for _ in range(calls):
        quick_start.xmlrpc("runFilters", ["vmsched_DedicatedCpus"], HOSTS, str(uuid.uuid4()), {})
    wait_until(lambda: log.read_text(errors="replace").count("plugin vmsched_DedicatedCpus failed") >=
               before.count("plugin vmsched_DedicatedCpus failed") + calls, 10, 0.1, "the failures logged")
    new = log.read_text(errors="replace")[len(before):]
    assert "Traceback" not in new and "wrote to stderr" not in new, new
    assert [line for line in new.splitlines() if "vmsched_DedicatedCpus" in line] == [
        line for line in new.splitlines() if "plugin vmsched_DedicatedCpus failed: dedicated CPUs of VM" in line]
