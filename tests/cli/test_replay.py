"""``vmsched replay`` on a recording the all-in-one made of real XML-RPC calls (the embedded bus).

The units here read no host facts (tests/whatif/test_replay_e2e.py has agents); what matters is the command:
what it reports, its exit status, its JSON and HTML, and its one line for bad input.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.stack import Stack, start_all_in_one

H = [f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(4)]
VM = "11111111-2222-3333-4444-555555555555"
SECRET = "hunter2-secret-value"
PLUGINS = '''
class Deny:
    """Drop the hosts of the deny property."""
    def do_filter(self, hosts, vm, args):
        deny = args.get("deny", "")
        return {h: "<b>denied</b> by the property" for h in hosts if h in deny.split(",")}


class Spread:
    """Prefer the first hosts."""
    def do_score(self, hosts, vm, args):
        return [(h, i) for i, h in enumerate(hosts)]


class Flat:
    """Every host alike."""
    def do_score(self, hosts, vm, args):
        return [(h, 1) for h in hosts]


class Move:
    """Move the VM of the property to the last host."""
    def do_balance(self, hosts, args):
        return (args.get("vm", ""), hosts[-1:])
'''


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(plugins folder, recording folder): calls the engine makes, recorded by the all-in-one."""
    tmp = tmp_path_factory.mktemp("replay")
    plugins = tmp / "plugins"
    plugins.mkdir()
    (plugins / "units.py").write_text(PLUGINS)
    rec = tmp / "rec"
    stack: Stack = start_all_in_one(tmp, "memory://", "--record", str(rec), "--record-omit", "password",
                                    plugins=plugins)
    try:
        props = {"deny": H[3], "password": SECRET}
        assert stack.xmlrpc("runFilters", ["Deny"], H, VM, props)["result"] == H[:3]
        assert stack.xmlrpc("runCostFunctions", [["Spread", 2], ["Flat", 1]], H, VM, props)["result"][0] == [H[0], 1]
        assert stack.xmlrpc("runCostFunctions", [["Flat", 1]], H[:2], VM, props)["result_code"] == 0
        assert stack.xmlrpc("runLoadBalancing", "Move", H, {"vm": VM})["result"] == [VM, H[3:]]
        stack.post("/v1/filter", json={"units": ["Deny"], "hosts": H})  # not the engine's: not recorded
    finally:
        stack.stop()  # SIGTERM: the writer writes what waits
    return plugins, rec


def replay(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vmsched.cli", "replay", *map(str, args), "--workers", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_recording_holds_the_engine_s_calls_without_the_omitted_property(recorded: tuple[Path, Path]):
    _, rec = recorded
    text = b"".join(gzip.decompress(p.read_bytes()) for p in rec.glob("*.jsonl.gz"))
    calls = [json.loads(line) for line in text.splitlines() if line.startswith(b'{"k":"call"')]
    assert [c["method"] for c in calls] == ["runFilters", "runCostFunctions", "runCostFunctions", "runLoadBalancing"]
    assert SECRET.encode() not in text and calls[0]["omitted"] == ["password"]
    assert calls[0]["args"] == [["Deny"], H, VM, {"deny": H[3]}]


def test_an_unchanged_policy_changes_nothing(recorded: tuple[Path, Path]):
    plugins, rec = recorded
    done = replay(rec, "--plugins", plugins, "--fail-on-change")
    assert done.returncode == 0, done.stderr
    assert "replayed 4 calls from 1 file(s)" in done.stdout
    for op, n in (("filter", 1), ("score", 2), ("balance", 1)):
        assert f"{op:8} {n:6} calls: 0 changed" in done.stdout


def test_a_changed_factor_changes_the_best_host_and_fails_the_guard(recorded: tuple[Path, Path], tmp_path: Path):
    plugins, rec = recorded
    html = tmp_path / "report.html"
    done = replay(rec, "--plugins", plugins, "--factor", "Spread=-1", "--fail-on-change", "--json", "--html", html)
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["calls"] == 4 and data["changed"] == 1 and data["ops"]["score"]["changed"] == 1
    (change,) = data["changes"]
    assert change["op"] == "score" and change["rank"] == 4 and change["properties"] == ["deny"]
    assert change["candidate"][H[3]]["Spread"] == "score 3 x-1" and change["baseline"][H[3]]["Spread"] == "score 3 x2"
    assert data["units"]["Spread"]["candidate"]["calls"] == 1 and data["units"]["Spread"]["baseline"]["p50"] is None
    page = html.read_text()
    assert "<script" not in page and SECRET not in done.stdout + page
    assert "score 3 x2 &rarr; score 3 x-1" in page and "<svg" in page


def test_reasons_are_escaped_in_the_html_report(recorded: tuple[Path, Path], tmp_path: Path):
    plugins, rec = recorded
    candidate = tmp_path / "candidate"
    shutil.copytree(plugins, candidate)
    (candidate / "units.py").write_text(PLUGINS.replace('h in deny.split(",")', 'h not in deny.split(",")'))
    html = tmp_path / "report.html"
    done = replay(rec, "--plugins", candidate, "--html", html)
    assert done.returncode == 0, done.stderr
    assert "filter        1 calls: 1 changed" in done.stdout
    page = html.read_text()
    assert "<b>denied</b>" not in page and "&lt;b&gt;denied&lt;/b&gt; by the property" in page


def test_a_baseline_folder_runs_side_by_side_and_its_durations_count(recorded: tuple[Path, Path]):
    plugins, rec = recorded
    data = json.loads(replay(rec, "--plugins", plugins, "--baseline", plugins, "--json").stdout)
    assert data["side_by_side"] and data["changed"] == 0
    assert data["units"]["Flat"]["baseline"]["p50"] is not None and data["units"]["Flat"]["candidate"]["p50"]


def test_added_and_dropped_units_and_a_unit_the_candidate_lacks(recorded: tuple[Path, Path], tmp_path: Path):
    plugins, rec = recorded
    data = json.loads(replay(rec, "--plugins", plugins, "--drop", "Spread", "--json").stdout)
    assert data["ops"]["score"]["changed"] == 1  # without Spread every host ties
    lacking = tmp_path / "lacking"
    lacking.mkdir()
    (lacking / "units.py").write_text(PLUGINS.replace("class Flat:", "class Level:"))
    done = replay(rec, "--plugins", lacking, "--fail-on-change", "--json")
    data = json.loads(done.stdout)
    assert done.returncode == 1 and data["changed"] == 0 and data["ops"]["score"]["unknown"] == 2
    assert data["units"]["Flat"]["candidate"]["unknown"] == 2
    data = json.loads(replay(rec, "--plugins", lacking, "--add", "score:Level=1", "--drop", "Flat", "--json").stdout)
    assert data["unknown"] == 0 and data["units"]["Level"]["candidate"]["calls"] == 2


@pytest.mark.parametrize("args, message", [
    (["nowhere.jsonl.gz"], "vmsched replay: error: nowhere.jsonl.gz: no such file or folder"),
    (["GARBAGE"], "is not gzip-compressed"),
    (["REC", "--factor", "NoSuchUnit=3"], "--factor NoSuchUnit: no score unit 'NoSuchUnit' in"),
    (["REC", "--factor", "Spread=x"], "--factor 'Spread=x': expected UNIT=N"),
    (["REC", "--add", "weight:Spread"], "--add 'weight:Spread': expected KIND:UNIT"),
    (["REC", "--since", "yesterday"], "--since 'yesterday': give a time as"),
])
def test_bad_input_gets_one_clear_line(recorded: tuple[Path, Path], tmp_path: Path, args: list[str], message: str):
    plugins, rec = recorded
    (tmp_path / "garbage.jsonl.gz").write_bytes(b"this is no recording")
    argv = [str(rec) if a == "REC" else str(tmp_path / "garbage.jsonl.gz") if a == "GARBAGE" else a for a in args]
    done = replay(*argv, "--plugins", plugins)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr
