"""scripts/run runs in the caller's folder: every relative path is taken from there."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.support.net import free_port
from tests.support.paths import ROOT


def test_relative_paths_are_the_callers(tmp_path: Path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "keep.py").write_text(
        "class KeepAll:\n    def do_filter(self, hosts, vm, args):\n        print(hosts)\n")
    token = subprocess.run([str(ROOT / ".venv" / "bin" / "vmsched"), "token", "new", "--name", "me", "--role", "read",
                            "--file", "conf/tokens.yaml"], cwd=tmp_path, capture_output=True, text=True,
                           check=True).stdout.strip()
    port = free_port()
    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(ROOT / "scripts" / "run"), "--plugins=plugins", "--port", str(port),
                                 "--tokens-file", "conf/tokens.yaml"], cwd=tmp_path, stdout=out, stderr=out,
                                env={**os.environ, "VMSCHED_METRICS_PORT": "0"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 180  # scripts/run may first (re)install vmsched into .venv
        units = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                units = httpx.get(f"http://127.0.0.1:{port}/v1/units", headers={"Authorization": f"Bearer {token}"})
                if units.status_code == 200 and units.json():
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert units is not None and units.status_code == 200, log.read_text()
        assert "KeepAll" in units.text, units.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
