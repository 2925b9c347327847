"""Record real engine calls on RabbitMQ while two real agents publish facts, then replay them.

Real processes: two policy agents on libvirt's test driver (hv-busy with 4 guests, hv-idle with 1), the gateway,
the scoring and the balancer services, each recording to a folder of its own (--record). The calls come over
XML-RPC as the engine makes them. After the recording, every guest of hv-busy stops, so the live facts differ
from the recorded ones; the replays must still see what the units saw then.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services.test_facts_bus import facts_of
from tests.support.agents import agent
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.stack import Proc, Stack, bus_args
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")

HOSTS = ["hv-busy", "hv-idle", "hv-gone"]  # hv-gone: no agent
VM = "11111111-2222-3333-4444-555555555555"
UNITS = '''
from vmsched.plugin import facts


def _why(f):
    return f"{f.guests_running} guests, {f.age:.1f} s old"


class GuestCap:
    """Keep hosts with fewer than MaxGuests running guests (hosts without facts too)."""
    def do_filter(self, hosts, vm, args):
        cap = int(args.get("MaxGuests") or 100)
        return {h: _why(f) for h in hosts if (f := facts.host(h)) is not None and f.guests_running >= cap}


class FewestGuests:
    """Weight = running guests."""
    def do_score(self, hosts, vm, args):
        return [(h, f.guests_running, _why(f)) for h in hosts if (f := facts.host(h)) is not None]


class MostGuests:
    """Weight = minus the running guests."""
    def do_score(self, hosts, vm, args):
        return [(h, -f.guests_running, _why(f)) for h in hosts if (f := facts.host(h)) is not None]
'''
#: the candidate's GuestCap also drops the hosts with fewer than 2 guests
CANDIDATE = UNITS.replace("f.guests_running >= cap}", "(f.guests_running >= cap or f.guests_running < 2)}")
FAILING = '''
import time


class Raises:
    """Always fails."""
    def do_filter(self, hosts, vm, args):
        raise RuntimeError("no hosts for you")


class Hangs:
    """Never answers."""
    def do_filter(self, hosts, vm, args):
        time.sleep(60)
'''


def _plugins(folder: Path, units: str) -> Path:
    shutil.copytree(ROOT / "plugins", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "e2e_units.py").write_text(units)
    return folder


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory, rabbit_vhost: str) -> tuple[Path, list[Path], float, float]:
    """(the live plugins folder, the three recording folders, when the three rounds of calls began and ended)."""
    tmp = tmp_path_factory.mktemp("e2e")
    plugins = _plugins(tmp / "plugins", UNITS)
    folders = [tmp / "rec-gateway", tmp / "rec-scoring", tmp / "rec-balancer"]
    port = free_port()
    common = [*bus_args(tmp, rabbit_vhost), "--facts-max-age", "5"]
    plugin_args = ["--plugins", str(plugins), "--pool-size", "2"]
    procs = [Proc(["gateway", "--port", str(port), "--record", str(folders[0]), "--record-omit", "password",
                   *common], tmp / "gateway.log", env={"VMSCHED_AMQP_URL": ""}),
             Proc(["scoring", *plugin_args, "--record", str(folders[1]), *common], tmp / "scoring.log",
                  env={"VMSCHED_AMQP_URL": ""}),
             Proc(["balancer", *plugin_args, "--record", str(folders[2]), *common], tmp / "balancer.log",
                  env={"VMSCHED_AMQP_URL": ""})]
    stack = Stack(port, plugins, [p.start() for p in procs])
    try:
        stack.wait_ready(queues=("vmsched.filter.v2", "vmsched.score.v2", "vmsched.balance.v2"))
        stack.procs += [agent(tmp, rabbit_vhost, "hv-busy", [("b1", 512), ("b2", 128), ("b3", 512), ("b4", 512)]),
                        agent(tmp, rabbit_vhost, "hv-idle", [("i1", 256)])]
        wait_until(lambda: all(facts_of(stack, h) for h in HOSTS[:2]), 30, 0.1, "facts of both agents")

        def weights() -> dict[str, int]:
            reply = stack.xmlrpc("runCostFunctions", [["FewestGuests", 2], ["MostGuests", 1]], HOSTS, VM, {})
            return dict(reply["result"])

        # the services' caches hold both hosts: hv-idle is best (2 x 1 - 1 = 1 against 2 x 4 - 4 = 4)
        wait_until(lambda: weights() == {"hv-busy": 4, "hv-idle": 1, "hv-gone": 7}, 20, 0.2, "weights from facts")
        began = time.time()  # the calls before: while the caches filled
        for _ in range(3):  # three rounds, on facts of several generations (the agents collect every 0.5 s)
            kept = stack.xmlrpc("runFilters", ["GuestCap"], HOSTS, VM, {"MaxGuests": "10", "password": "pw-1"})
            assert kept["result"] == HOSTS and kept["result_code"] == 0
            assert min(weights().items(), key=lambda kv: kv[1])[0] == "hv-idle"
            move = stack.xmlrpc("runLoadBalancing", "vmsched_EvenGuestDistribution", HOSTS[:2],
                                {"HighVmCount": "3", "MigrationThreshold": "2"})
            assert move["result"][1] == ["hv-idle"]
            time.sleep(0.7)
        ended = time.time()
        # the facts change after the recording: every guest of hv-busy stops
        for guest in ("b1", "b2", "b3", "b4"):
            r = stack.post(f"/v1/hosts/hv-busy/domains/{guest}/stop", json={"wait": 10, "force": True})
            assert r.status_code == 200, r.text
        wait_until(lambda: facts_of(stack, "hv-busy")["host"]["guests_running"] == 0, 10, 0.1, "hv-busy empty")
        assert min(weights().items(), key=lambda kv: kv[1])[0] == "hv-busy"  # live, the best host is another now
    finally:
        stack.stop()
    return plugins, folders, began, ended


def replay(folders: list[Path], *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vmsched.cli", "replay", *map(str, folders), *map(str, args),
                           "--workers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)


Recording = tuple[Path, list[Path], float, float]


def test_an_unchanged_folder_changes_no_decision(recording: Recording):
    plugins, folders, _, _ = recording
    done = replay(folders, "--plugins", plugins, "--fail-on-change", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["calls"] >= 3 * 3 and data["changed"] == 0 and data["unknown"] == 0 and data["skipped"] == {}
    assert {op: c["calls"] >= 3 for op, c in data["ops"].items()} == {"filter": True, "score": True, "balance": True}


def test_a_dropping_unit_and_a_flipping_factor_change_exactly_the_expected_calls(
        recording: Recording, tmp_path: Path):
    _, folders, began, ended = recording
    candidate = _plugins(tmp_path / "candidate", CANDIDATE)
    done = replay(folders, "--plugins", candidate, "--factor", "MostGuests=3", "--json", "--since", began, "--until", ended)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    ops = data["ops"]
    assert ops["filter"]["changed"] == ops["filter"]["calls"] == 3  # every filter call: hv-idle dropped
    assert ops["score"]["changed"] == ops["score"]["calls"] == 3  # every score call: hv-busy ranks first
    assert ops["balance"]["changed"] == 0 and ops["balance"]["calls"] == 3
    for change in data["changes"]:
        cand, base = change["candidate"], change["baseline"]
        if change["op"] == "filter":
            assert change["what"] == "keeps 2 hosts (baseline 3): drops hv-idle"
            assert cand["hv-idle"]["GuestCap"].startswith("dropped: 1 guests, ")
            assert base["hv-idle"]["GuestCap"] == "kept" and cand["hv-gone"]["GuestCap"] == "kept"
            assert change["properties"] == ["MaxGuests"] and change["omitted"] == ["password"]
        else:
            assert change["what"].startswith("ranks hv-busy first instead of hv-idle") and change["rank"] == 2
            # the recorded facts: 4 guests on hv-busy (live it has none), aged as at the call, not now
            cell = cand["hv-busy"]["MostGuests"]
            assert cell.startswith("score -4 x3: 4 guests, ") and base["hv-busy"]["MostGuests"].startswith("score -4: ")
            age = float(cell.split(", ")[1].split(" s old")[0])
            assert age < 3.0 < time.time() - ended, (cell, time.time() - ended)
    assert "pw-1" not in done.stdout


def test_a_unit_that_raises_and_one_that_hangs_are_reported_and_the_replay_finishes(
        recording: Recording, tmp_path: Path):
    plugins, folders, _, _ = recording
    candidate = _plugins(tmp_path / "candidate", UNITS)
    (candidate / "failing.py").write_text(FAILING)
    started = time.monotonic()
    done = replay(folders, "--plugins", candidate, "--add", "filter:Raises", "--add", "filter:Hangs",
                  "--timeout", "1", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    n = data["ops"]["filter"]["calls"]
    assert data["changed"] == 0  # a failing filter is ignored, as live
    raises, hangs = data["units"]["Raises"]["candidate"], data["units"]["Hangs"]["candidate"]
    assert hangs["calls"] == hangs["timeouts"] == n
    # the pool runs cheap units of a call together on one worker until it knows their cost, as live: a Raises
    # that shared Hangs' worker times out with it
    assert raises["calls"] == raises["errors"] + raises["timeouts"] == n and raises["errors"] >= 1
    assert time.monotonic() - started < 120
