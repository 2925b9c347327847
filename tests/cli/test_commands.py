"""The command line: `vmsched run` starts and answers with the stock plugins; --help; settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.net import free_port
from tests.support.paths import ROOT, TEST_PLUGINS
from tests.support.stack import Proc, Stack
from vmsched.cli import build_parser, settings_from
from vmsched.config import Settings, stock_plugins_dir

H = ["aaaaaaaa-0000-0000-0000-000000000001", "aaaaaaaa-0000-0000-0000-000000000002",
     "aaaaaaaa-0000-0000-0000-000000000003"]
VM = "11111111-2222-3333-4444-555555555555"


def vmsched(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_vmsched_run_starts_and_answers_with_stock_plugins(tmp_path: Path):
    port = free_port()
    proc = Proc(["run", "--port", str(port)], tmp_path / "run.log").start()
    stack = Stack(port, stock_plugins_dir(), [proc])
    try:
        stack.wait_ready()
        found = stack.xmlrpc("discover")
        assert set(found["filters"]) == {"HostAllowDeny", "vmsched_Memory", "vmsched_CpuOverloaded", "vmsched_Swap",
                                         "vmsched_MaxVms", "vmsched_DedicatedCpus"}
        assert set(found["scores"]) == {"PreferredHosts", "vmsched_EvenGuestDistribution", "vmsched_CpuEvenDistribution",
                                        "vmsched_CpuPowerSaving", "vmsched_MemoryEvenDistribution",
                                        "vmsched_MemoryPowerSaving", "vmsched_TargetLoadPacking",
                                        "vmsched_LoadVariationRisk", "vmsched_DedicatedCpus"}
        assert set(found["balance"]) == {"DrainHosts", "vmsched_EvenGuestDistribution", "vmsched_CpuEvenDistribution",
                                         "vmsched_MemoryEvenDistribution", "vmsched_CpuPowerSaving"}
        assert stack.xmlrpc("runFilters", ["HostAllowDeny"], H, VM, {"denied_hosts": H[1]})["result"] == [H[0], H[2]]
        assert stack.xmlrpc("runFilters", ["HostAllowDeny"], H, VM,
                            {"allowed_hosts": f"{H[2]}, {H[0]}"})["result"] == [H[0], H[2]]
        scores = stack.xmlrpc("runCostFunctions", [["PreferredHosts", 1]], H, VM, {"preferred_hosts": f"{H[2]},{H[1]}"})
        assert scores["result"] == [[H[0], 100], [H[1], 1], [H[2], 0]]
        move = stack.xmlrpc("runLoadBalancing", "DrainHosts", H, {"drain_vm": VM, "drain_hosts": H[0]})
        assert move["result"] == [VM, H[1:]]
        assert stack.xmlrpc("runLoadBalancing", "DrainHosts", H, {})["result"] == ["", []]
        assert "embedded memory://" in proc.output()
    finally:
        stack.stop()


@pytest.mark.parametrize("command", ["run", "gateway", "discovery", "scoring", "balancer"])
def test_help_documents_the_options(command: str):
    out = vmsched(command, "--help")
    assert out.returncode == 0
    for option in ("--amqp", "--log-level"):
        assert option in out.stdout
    if command in ("run", "discovery", "scoring", "balancer"):
        assert "--plugins" in out.stdout and "OSCHEDPROXY_PLUGINS" in out.stdout
    if command in ("run", "gateway"):
        assert "--port" in out.stdout and "18781" in out.stdout


def test_every_flag_maps_to_a_setting():
    fields = set(Settings.model_fields)
    dests = set(vars(build_parser().parse_args(["run"]))) - {"command", "func"}  # the subcommand, its handler
    assert len(dests) > 20
    for dest in dests:
        assert dest in fields, f"--{dest} has no setting"


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VMSCHED_PORT", "1234")
    monkeypatch.setenv("OSCHEDPROXY_PLUGINS", str(TEST_PLUGINS))
    args = build_parser().parse_args(["gateway", "--port", "4321"])
    s = settings_from(args)
    assert s.port == 4321 and s.plugins_dir == TEST_PLUGINS
    monkeypatch.setenv("VMSCHED_PLUGIN_TIMEOUTS", "A=2, B=0.5")
    assert Settings().plugin_timeouts == {"A": 2.0, "B": 0.5}


def test_bad_settings_are_a_clear_error():
    out = vmsched("gateway", "--port", "99999")
    assert out.returncode == 2
    assert "port" in out.stderr and "Traceback" not in out.stderr
    out = vmsched("scoring", "--plugin-timeouts", "nonsense")
    assert out.returncode == 2 and "NAME=SECONDS" in out.stderr
    out = vmsched("run", "--plugins", "/nonexistent/plugins", "--port", str(free_port()))
    assert out.returncode == 2 and "plugins folder /nonexistent/plugins does not exist" in out.stderr
    assert "Traceback" not in out.stderr
