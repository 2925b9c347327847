"""The broker a process uses is named at start, with where it came from; warnings name it too, a few lines
for all the threads that cannot reach it, never its password."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.net import free_port
from tests.support.paths import ROOT
from vmsched.cli.settings import broker_origin
from vmsched.logs import Throttle, broker


def test_a_broker_is_named_without_its_password():
    assert broker("amqp://guest:guest@127.0.0.1:5672//") == "amqp://127.0.0.1:5672 (vhost /, user guest)"
    assert broker("amqps://me:s3cret@node1/vmsched;amqps://me:s3cret@node2:5999/vmsched") == (
        "amqps://node1:5671 (vhost vmsched, user me); amqps://node2:5999 (vhost vmsched, user me)")
    assert broker("amqp://h/%2F") == "amqp://h:5672 (vhost /, user guest)"


def test_where_the_broker_comes_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for name in ("VMSCHED_AMQP_URL", "VMSCHED_AMQP_URL_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert broker_origin({}).startswith("the default, as no --amqp-url-file, VMSCHED_AMQP_URL_FILE, --amqp or")
    assert broker_origin({"amqp_url": "amqp://h//"}) == "--amqp"
    monkeypatch.setenv("VMSCHED_AMQP_URL", "amqp://u:p@h//")
    assert broker_origin({}) == "VMSCHED_AMQP_URL"
    monkeypatch.setenv("VMSCHED_AMQP_URL_FILE", str(tmp_path / "url"))
    assert broker_origin({}) == f"the URL file {tmp_path / 'url'} (VMSCHED_AMQP_URL_FILE)"
    assert broker_origin({"amqp_url_file": "/etc/u"}) == "the URL file /etc/u (--amqp-url-file)"


def test_a_lasting_trouble_is_a_few_lines():
    now = [0.0]
    throttle = Throttle(first_gap=1.0, longest=4.0, clock=lambda: now[0])
    shown = []
    for tick in range(100):  # three threads failing every 0.1 s for 10 s
        now[0] = tick / 10
        for _ in range(3):
            held = throttle.allow("b")
            if held is not None:
                shown.append((now[0], held))
    assert [at for at, _ in shown] == [0.0, 1.0, 3.0, 7.0]  # 1 s, 2 s, then at most 4 s apart
    assert shown[0][1] == "" and shown[1][1] == " (29 more like it since the last line)"
    throttle.clear("b")
    assert throttle.allow("b") == ""  # a new trouble: said at once


def test_the_gateway_names_its_broker_and_says_it_is_unreachable_in_few_lines(tmp_path: Path):
    closed = free_port()
    url_file = tmp_path / "amqp.url"
    url_file.write_text(f"amqp://someone:s3cret@127.0.0.1:{closed}/vh\n")
    log = tmp_path / "gateway.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "vmsched.cli", "gateway", "--port", str(free_port())],
                                cwd=ROOT, stdout=out, stderr=out, start_new_session=True,
                                env={**os.environ, "VMSCHED_METRICS_PORT": "0", "VMSCHED_AMQP_URL_FILE": str(url_file),
                                     "VMSCHED_CONNECT_TIMEOUT": "0.5", "VMSCHED_RECONNECT_MAX_DELAY": "1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and log.read_text().count(" WARNING ") < 3 and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(4)  # the retries go on: every thread fails every second now
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    text = log.read_text()
    assert "s3cret" not in text
    where = f"amqp://127.0.0.1:{closed} (vhost vh, user someone)"
    assert f"INFO vmsched: bus: RabbitMQ at {where}, from the URL file {url_file} (VMSCHED_AMQP_URL_FILE)" in text, text
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    assert len(warnings) >= 3, text
    assert all(where in line for line in warnings), text
    times = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() for line in warnings]
    assert all(later - earlier >= 0.95 for earlier, later in zip(times, times[1:])), text  # never a burst
    assert "more like it since the last line" in text  # the threads' other failures: counted, not written
