"""Output for people: a closed pipe ends a command quietly; the agent's policies as tables."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.policy_agent.surfaces import tables
from tests.support.paths import ROOT


@pytest.mark.parametrize("argv", [["run", "--help"], ["policy", "set", "--help"]])
def test_a_closed_pipe_ends_quietly(argv: list[str]):
    proc = subprocess.Popen([sys.executable, "-P", "-m", "vmsched.cli", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head` that has read enough, before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""


VIEW = {"guest": "db", "uuid": "u-1", "state": "running", "status": "applied", "error": None, "warnings": [],
        "policy": {"dedicated": 2, "requires": ["web", "cache"], "vcpu_pins": {"0": "1"}},
        "allocation": "4-5", "desired": {"vcpus": {"0": "4", "1": "5"}, "emulator": "0-3", "cpu_shares": None}}


def test_policy_tables():
    assert tables.policies({"policies": [VIEW]}).splitlines() == [
        "GUEST  STATE    STATUS   POLICY                                        ALLOCATION  ERROR",
        "db     running  applied  dedicated=2 requires=web,cache vcpu_pins=0:1  4-5         -"]
    assert tables.policies({"policies": []}) == "no guest has a policy on this host\n"
    assert tables.policy(VIEW).splitlines() == [
        "guest       db (u-1)",
        "state       running",
        "status      applied",
        "policy      dedicated=2 requires=web,cache vcpu_pins=0:1",
        "allocation  4-5",
        "desired     vcpus=0:4,1:5 emulator=0-3",
        "warnings    -",
        "error       -"]
