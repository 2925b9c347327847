"""The fast tier (``-m "not rabbitmq and not libvirt and not slow"``) selects no heavy test.

Markers are written on the tests themselves; this checks them against the tests' code
(tests/support/tiers.py): a pytest collection in a subprocess, with the fast tier's marker
expression, records which tests were selected and which reach a broker or libvirtd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from tests.support.paths import ROOT
from tests.support.tiers import FAST_TIER



@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("tiers") / "items.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.support.tiers", "-m", FAST_TIER, "tests"],
                          cwd=ROOT, env={**os.environ, "VMSCHED_TIERS_OUT": str(out)},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _files(rows: list[dict]) -> Counter[str]:
    return Counter(r["id"].split("::", 1)[0] for r in rows)


def test_the_fast_tier_selects_no_test_that_needs_a_broker_or_libvirtd(collected: list[dict]):
    heavy_selected = [r["id"] for r in collected if r["selected"] and r["heavy"]]
    assert not heavy_selected, ("these tests reach a broker or libvirtd but are not marked rabbitmq, libvirt "
                                "or slow:\n" + "\n".join(heavy_selected))


def test_nothing_under_e2e_is_in_the_fast_tier(collected: list[dict]):
    e2e = [r for r in collected if r["id"].startswith("tests/e2e/")]
    assert {"tests/e2e/test_rabbitmq_cluster.py", "tests/e2e/test_console_browser.py",
            "tests/e2e/test_prometheus_real.py", "tests/e2e/libvirt/test_reboot.py"} <= set(_files(e2e))
    assert [r["id"] for r in e2e if r["selected"]] == []


def test_the_heavy_tests_are_found_and_left_out(collected: list[dict]):
    """The check above sees the heavy tests: those on the shared broker, on private nodes and on libvirtd."""
    heavy = _files([r for r in collected if r["heavy"]])
    for path in ("tests/bus/test_poison.py",  # a private vhost of the shared broker
                 "tests/bus/test_permissions.py",  # private RabbitMQ nodes
                 "tests/gateway/engine/test_scheduling_path.py",  # the rabbitmq case of the stack fixture
                 "tests/e2e/libvirt/test_restart.py"):  # the real libvirtd
        assert heavy[path] > 0, path
    assert all(not r["selected"] for r in collected if r["heavy"])
    # and the light cases of the same modules stay in the fast tier
    light = _files([r for r in collected if r["selected"]])
    assert light["tests/bus/test_poison.py"] > 0 and light["tests/gateway/engine/test_scheduling_path.py"] > 0


def test_the_tests_run_alone_and_the_real_qemu_ones_are_where_scripts_test_looks(collected: list[dict]):
    """scripts/test runs the tests marked alone after the others unless the tier leaves out slow ones, and
    the libvirt ones in a process of their own."""
    alone = [r for r in collected if "alone" in r["marks"]]
    assert alone and all("slow" in r["marks"] for r in alone), alone
    libvirt = {r["id"].split("::", 1)[0] for r in collected if "libvirt" in r["marks"]}
    assert libvirt and all(path.startswith("tests/e2e/libvirt/") for path in libvirt), libvirt
