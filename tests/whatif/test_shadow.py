"""A shadow candidate beside the live policy, in the all-in-one on both buses (`vmsched run --shadow`).

The live units answer at once. The candidate's namesakes change decisions, raise, hang, are slow or are
missing; none of that may change or hold up a live reply, and every call given to the shadow is counted once:
same, changed, unknown, error or shed.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import BUSES, Stack, start_all_in_one
from tests.support.waiting import wait_until

HOSTS = ["h1", "h2", "h3", "h4"]
VM = "11111111-2222-3333-4444-555555555555"
LIVE = '''
class Keep:
    """Keeps every host."""
    def do_filter(self, hosts, vm, args):
        return hosts


class Position:
    """Weight = position: the first host is best."""
    def do_score(self, hosts, vm, args):
        return [(h, i) for i, h in enumerate(hosts)]


class Reverse:
    """Weight = position from the end: the last host is best."""
    def do_score(self, hosts, vm, args):
        return [(h, len(hosts) - 1 - i) for i, h in enumerate(hosts)]


class Calm:
    """Keeps every host (its candidate namesake raises)."""
    def do_filter(self, hosts, vm, args):
        return hosts


class Patient:
    """Keeps every host (its candidate namesake hangs)."""
    def do_filter(self, hosts, vm, args):
        return hosts


class Quick:
    """Keeps every host (its candidate namesake is slow)."""
    def do_filter(self, hosts, vm, args):
        return hosts


class OnlyLive:
    """Keeps every host (the candidate has no such unit)."""
    def do_filter(self, hosts, vm, args):
        return hosts


class MoveFirst:
    """Moves the VM in property vm to the first host."""
    def do_balance(self, hosts, args):
        return (args.get("vm", ""), hosts[:1])
'''
CANDIDATE = '''
import time


class Keep:
    """Drops h2."""
    def do_filter(self, hosts, vm, args):
        return {h: "h2 is full" for h in hosts if h == "h2"}


class Position:
    def do_score(self, hosts, vm, args):
        return [(h, i) for i, h in enumerate(hosts)]


class Reverse:
    def do_score(self, hosts, vm, args):
        return [(h, len(hosts) - 1 - i) for i, h in enumerate(hosts)]


class Calm:
    def do_filter(self, hosts, vm, args):
        raise RuntimeError("the candidate broke")


class Patient:
    def do_filter(self, hosts, vm, args):
        time.sleep(3600)


class Quick:
    def do_filter(self, hosts, vm, args):
        time.sleep(0.3)
        return hosts


class MoveFirst:
    """Moves the VM to the last host."""
    def do_balance(self, hosts, args):
        return (args.get("vm", ""), hosts[-1:])
'''
#: (method, params, the live reply's result)
CALLS = [
    ("runFilters", (["Keep"], HOSTS, VM, {}), HOSTS),  # changed: the candidate drops h2
    ("runCostFunctions", ([["Position", 2], ["Reverse", 1]], HOSTS, VM, {}),  # changed: Reverse x5 ranks h4 first
     [["h1", 3], ["h2", 4], ["h3", 5], ["h4", 6]]),
    ("runFilters", (["Calm"], HOSTS, VM, {}), HOSTS),  # error: the candidate raises
    ("runFilters", (["Patient"], HOSTS, VM, {}), HOSTS),  # error: the candidate times out
    ("runFilters", (["Quick"], HOSTS, VM, {}), HOSTS),  # same, slowly
    ("runFilters", (["OnlyLive"], HOSTS, VM, {}), HOSTS),  # unknown: the candidate lacks it
    ("runLoadBalancing", ("MoveFirst", HOSTS, {"vm": VM}), [VM, ["h1"]]),  # changed: h4 instead
]
EXPECTED = {"same": 1, "changed": 3, "unknown": 1, "error": 2, "shed": 0}


def _folder(root: Path, name: str, units: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "units.py").write_text(units)
    return folder


def shadow_counts(stack: Stack) -> dict[str, float]:
    text = httpx.get(f"{stack.metrics_url}/metrics", timeout=10).text
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text) if f.name == "vmsched_shadow"
            for s in f.samples if s.name == "vmsched_shadow_total"}


@pytest.fixture(scope="module", params=BUSES)
def shadowed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    bus = "memory://" if request.param == "memory" else request.getfixturevalue("rabbit_vhost")
    tmp = tmp_path_factory.mktemp(f"shadow-{request.param}")
    live = _folder(tmp, "live", LIVE)
    candidate = _folder(live, "candidate", CANDIDATE)  # a subfolder of the live plugins (no __init__.py): not loaded
    stack = start_all_in_one(tmp, bus, "--shadow", str(candidate), "--shadow-factors",
                             "Reverse=5", "--shadow-queue", "100", "--plugin-timeouts", "Patient=2",
                             plugins=live)
    yield stack
    stack.stop()


def test_a_raising_hanging_or_slow_candidate_never_changes_or_holds_up_a_live_reply(shadowed: Stack):
    before = shadow_counts(shadowed)
    assert set(before) == set(EXPECTED) and not any(before.values()), before
    for method, params, result in CALLS * 2:
        started = time.monotonic()
        reply = shadowed.xmlrpc(method, *params)
        took = time.monotonic() - started
        assert reply["result"] == result and not reply["plugin_errors"], (method, params, reply)
        # the candidate's hang lasts its 2 s timeout and its slow unit 0.3 s; the live reply waits for neither
        assert took < 1.5, f"{method} {params[0]}: the live reply took {took:.2f} s"
    expected = {k: 2 * v for k, v in EXPECTED.items()}
    wait_until(lambda: sum(shadow_counts(shadowed).values()) >= len(CALLS) * 2, 30, 0.2, "every call compared")
    assert shadow_counts(shadowed) == expected


def test_the_gateway_keeps_each_comparison_with_its_decision(shadowed: Stack):
    vm = "22222222-3333-4444-5555-666666666666"
    ids: list[str] = []

    def newest() -> str:
        return shadowed.get("/v1/decisions", params={"limit": 1}).json()["decisions"][0]["id"]

    for method, params, result in CALLS:
        params = tuple(vm if p == VM else ({"vm": vm} if p == {"vm": VM} else p) for p in params)
        before = newest()
        reply = shadowed.xmlrpc(method, *params)
        assert reply["result"] == ([vm, ["h1"]] if method == "runLoadBalancing" else result)
        ids.append(wait_until(lambda: (found := newest()) != before and found, 10, 0.05, "the call's decision"))

    def shown() -> list[dict] | None:
        found = [shadowed.get(f"/v1/shadow/{i}") for i in ids]
        return [r.json() for r in found] if all(r.status_code == 200 for r in found) else None

    keep, score, calm, patient, quick, only_live, move = wait_until(shown, 30, 0.2, "every comparison")
    assert keep["status"] == "changed" and "drops h2" in keep["what"]
    assert keep["rows"] == [{"host": "h2", "live": {"Keep": "kept", "result": "kept"},
                             "candidate": {"Keep": "dropped: h2 is full", "result": "dropped"}}]
    assert score["status"] == "changed" and score["what"].startswith("ranks h4 first instead of h1")
    assert score["change"] == ["Reverse factor 5"] and score["rank"] == 4
    assert calm["status"] == "error" and "the candidate broke" in calm["errors"]["Calm"]
    assert patient["status"] == "error" and patient["errors"] == {"Patient": "timed out"}
    assert quick["status"] == "same" and quick["seconds"] >= 0.3
    assert only_live["status"] == "unknown" and only_live["unknown"] == ["OnlyLive"]
    assert move["status"] == "changed" and f"migrating {vm} to h4 instead of migrating {vm} to h1" in move["what"]
    record = shadowed.get(f"/v1/decisions/{ids[0]}").json()
    assert record["shadow"]["status"] == "changed" and record["result"] == HOSTS  # the live decision stands


def test_a_shadow_that_is_behind_sheds_calls_and_counts_them(tmp_path: Path):
    live = _folder(tmp_path, "live", LIVE)
    candidate = _folder(tmp_path, "candidate", CANDIDATE)
    stack = start_all_in_one(tmp_path, "memory://", "--shadow", str(candidate),
                             "--shadow-queue", "1", "--plugin-timeouts", "Patient=2", plugins=live)
    try:
        calls = 8
        started = time.monotonic()
        with ThreadPoolExecutor(calls) as clients:  # together: the candidate's queue is full when most arrive
            replies = list(clients.map(lambda _: stack.xmlrpc("runFilters", ["Patient"], HOSTS, VM, {}),
                                       range(calls)))
        elapsed = time.monotonic() - started
        assert all(reply["result"] == HOSTS for reply in replies)
        # one runs (2 s), one waits, the rest find the queue full; on a slow machine a run may end meanwhile
        wait_until(lambda: sum(shadow_counts(stack).values()) >= calls, 30, 0.2, "every call counted")
        counts = shadow_counts(stack)
        ended = int(elapsed // 2)  # candidate runs that can have ended (each times out after 2 s) while calls came
        assert sum(counts.values()) == calls and counts["shed"] >= calls - 2 - ended and counts["error"] >= 1, \
            (counts, elapsed)
    finally:
        stack.stop()
