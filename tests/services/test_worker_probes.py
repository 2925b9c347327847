"""A worker service's own HTTP port: /metrics, /healthz, and /readyz that follows the bus."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import free_port
from tests.support.stack import Proc, bus_args, plugin_copy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq


def _get(port: int, path: str) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except httpx.HTTPError:
        return None


def test_worker_probes_follow_the_bus(tmp_path: Path, rabbit_vhost: str):
    port = free_port()
    plugins = plugin_copy(tmp_path)
    good = Proc(["scoring", *bus_args(tmp_path, rabbit_vhost), "--plugins", str(plugins), "--metrics-port", str(port),
                 "--pool-size", "1"], tmp_path / "scoring.log").start()
    try:
        ready = wait_until(lambda: (r := _get(port, "/readyz")) is not None and r.status_code == 200 and r, 30)
        assert ready.json() == {"ready": True}
        assert _get(port, "/healthz").json() == {"status": "ok"}
        names = {f.name for f in text_string_to_metric_families(_get(port, "/metrics").text)}
        assert {"vmsched_plugin_units", "vmsched_bus_connected"} <= names
        assert _get(port, "/nope").status_code == 404
    finally:
        good.kill()

    port = free_port()
    closed = free_port()
    bad = Proc(["scoring", *bus_args(tmp_path, f"amqp://guest:guest@127.0.0.1:{closed}//"), "--plugins", str(plugins),
                "--metrics-port", str(port), "--pool-size", "1"], tmp_path / "scoring-bad.log").start()
    try:
        alive = wait_until(lambda: _get(port, "/healthz"), 30)
        assert alive.status_code == 200  # the process is up ...
        assert _get(port, "/readyz").status_code == 503  # ... but not ready without a broker
        wait_until(lambda: f"bus connection to amqp://127.0.0.1:{closed} (vhost /, user guest) failed" in bad.output(),
                   30, what="the retry log line, naming the broker")
        assert ":guest@" not in bad.output() and ":guest@" not in good.output()  # no broker password in a log
    finally:
        bad.kill()
