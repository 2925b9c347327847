"""A unit whose file failed to load answers with that file's load error; the old SDK's import error says how to port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT, TEST_PLUGINS
from vmsched.bus.inprocess import InProcessTransport
from vmsched.config import Settings
from vmsched.messages import Kind
from vmsched.runtime.contract import KIND
from vmsched.services.scoring import ScoringService

H = ["h1", "h2"]


@pytest.fixture(scope="module")
def scoring():
    service = ScoringService(Settings(plugins_dir=TEST_PLUGINS, amqp_url="memory://", facts=False), InProcessTransport())
    service.pool.start()
    service.catalog.refresh()
    try:
        yield service
    finally:
        service.pool.close()


def test_a_unit_of_a_file_that_failed_to_load(scoring: ScoringService):
    runs = scoring.run_units(Kind.FILTER, ["NeverSeen", "NoSuchUnit", "KeepEven"], KIND["filter"].args(H, "vm", {}),
                             deadline=time.time() + 30, timeout=None)
    errors = {run.name: run.result.error for run in runs}
    assert errors["NeverSeen"].startswith("filter unit 'NeverSeen' is in broken_import.py, which failed to load: ")
    assert "module_that_does_not_exist" in errors["NeverSeen"]
    assert errors["NoSuchUnit"] == "unknown filter unit 'NoSuchUnit'"
    assert runs[2].result.ok


def test_the_old_sdk_import_points_to_the_porting_section(tmp_path: Path):
    (tmp_path / "old_sample.py").write_text("from ovirtsdk.api import API\n\n\nclass max_vms:\n"
                                            "    def do_filter(self, hosts_ids, vm_id, args_map):\n        pass\n")
    out = subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", "plugin", "check", str(tmp_path / "old_sample.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, env=os.environ)
    assert out.returncode == 1
    assert "No module named 'ovirtsdk'" in out.stdout and "docs/plugins.md, 'Porting an old sample'" in out.stdout
