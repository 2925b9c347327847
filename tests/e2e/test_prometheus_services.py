"""A real Prometheus (Debian's package) against the separate services on RabbitMQ and a policy agent.

Started here, on the shared RabbitMQ in this module's own vhost: the gateway, discovery, scoring and
balancer as four processes, and a policy agent on libvirt's in-process test driver (``test:///default``)
publishing host facts every second. Every /metrics is served over TLS (--metrics-tls-cert, a test CA) and
needs the tests' read token (the services' --metrics-auth, the agent's --metrics-tokens-file), and one
configuration from the template (scripts/prometheus-config local --token-file --ca-file, with the shipped
alert rules) scrapes them all. Traffic:
discover, filter, score and balance requests, with failing units (``Raises``), units killed at the 1 s
plugin timeout (``Hangs``), and a refused and an applied ``policy set``. Then:

* every dashboard expression parses in Prometheus (its HTTP API), and the core panels return data, the
  agents' host rows (CPU, memory, guests, facts age) included;
* the overview's request rate and error ratio, over a window between two of the gateway's scrapes, are the
  gateway's own counts of the requests in it and of its error replies (within 5%; the all-services sum
  of requests is about twice that);
* freezing (SIGSTOP) and then killing the scoring service makes the "component down" expression
  (VmschedComponentDown's) true at the first or second scrape after the freeze (counted in scrapes, from
  Prometheus's own samples), for scoring only; once killed, its only replica also reads absent.

Heavy (a Prometheus server, five processes, the broker): marked ``slow``; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.net import free_port
from tests.support.paths import ROOT, TEST_PLUGINS
from tests.support.stack import AUTH, Proc, bus_args
from tests.support.waiting import wait_until
from tests.deploy.test_alert_rules import alerts, prometheus_tool
from tests.deploy.test_metrics import dashboard_queries
from tests.e2e.test_prometheus_real import Prometheus, _config, _samples, freeze_then_kill, scrape_files
from tests.support.tls_certs import make_certs

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")
pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

HOSTS = ["h1", "h2", "h3", "h4"]
SERVICES = ("gateway", "discovery", "scoring", "balancer")
#: the engine's overview, the plugin and bus panels, health, the agent rows
CORE_PANELS = [
    "Request rate (engine)", "Engine fallbacks (error replies)", "p99 request duration (engine)", "Components down",
    "Rate by service and operation", "Errors by service, operation and outcome", "p50 duration", "p99 duration",
    "Plugin calls by unit and outcome", "Plugin errors and timeouts", "Bus connections", "Targets up by component",
    "Policy applications (ok, error, refused) and errors", "Repairs by trigger", "libvirt events",
    "Dedicated CPUs free per host", "Host CPU use per host", "Host memory per host", "Guests running per host",
    "Host facts age per host", "Host facts: stale hosts",
]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory, rabbit_vhost: str, test_tokens_file: Path
             ) -> Iterator[dict[str, Any]]:
    binary = prometheus_tool("prometheus")
    work = tmp_path_factory.mktemp("prometheus-services")
    api, ports = free_port(), {name: free_port() for name in (*SERVICES, "agent")}
    bus = bus_args(work, rabbit_vhost)
    certs = make_certs(work / "tls")
    tls = ["--metrics-tls-cert", str(certs.server_cert), "--metrics-tls-key", str(certs.server_key)]
    env = {"VMSCHED_AMQP_URL": "", "VMSCHED_AGENT_AMQP": ""}
    plugins = ["--plugins", str(TEST_PLUGINS), "--plugin-timeout", "1", "--pool-size", "1", "--consumers", "1"]
    args = {
        "gateway": ["gateway", "--host", "127.0.0.1", "--port", str(api), "--facts-max-age", "5"],
        "discovery": ["discovery", *plugins],
        "scoring": ["scoring", *plugins, "--facts-max-age", "5"],
        "balancer": ["balancer", *plugins, "--facts-max-age", "5"],
    }
    procs = {name: Proc([*argv, *bus, "--metrics-port", str(ports[name]), "--metrics-auth", *tls],
                        work / f"{name}.log", env=env).start() for name, argv in args.items()}
    procs["agent"] = Proc(["agent", "--libvirt", "test:///default", "--host-id", "h1", *bus,
                           "--state-dir", str(work / "state"), "--lock-dir", str(work / "lock"),
                           "--socket", str(work / "agent.sock"), "--dedicated-pool", "4-7", "--facts-interval", "1",
                           "--metrics-port", str(ports["agent"]), "--metrics-tokens-file", str(test_tokens_file),
                           *tls],
                          work / "agent.log", env=env).start()
    token, agents = scrape_files(work, ports["agent"])
    config = work / "prometheus.yml"
    config.write_text(_config(*(a for name in SERVICES for a in ("--target", f"{name}=127.0.0.1:{ports[name]}")),
                              "--agents-dir", str(agents), "--token-file", str(token), "--ca-file", str(certs.ca)))
    prom = None
    try:
        base = f"http://127.0.0.1:{api}"
        wait_until(lambda: _ready(base, procs), 90, 0.2, "the gateway to see a consumer on every request queue")
        for name in ("discovery", "scoring", "balancer", "agent"):
            probe = f"https://127.0.0.1:{ports[name]}/{'healthz' if name == 'agent' else 'readyz'}"
            wait_until(lambda: _alive(procs) and _get(probe, certs.ca), 60, 0.2, f"{name} ready")
        prom = Prometheus(binary, config, work)
        prom.wait_ready()
        yield {"prom": prom, "procs": procs, "api": base, "work": work, "ca": certs.ca,
               "gateway_metrics": f"https://127.0.0.1:{ports['gateway']}/metrics"}
    finally:
        if prom is not None:
            prom.stop()
        for proc in procs.values():
            _stop(proc)


def _alive(procs: dict[str, Proc]) -> bool:
    for name, proc in procs.items():
        if proc.popen is not None and proc.popen.poll() is not None:
            raise AssertionError(f"{name} exited ({proc.popen.returncode}):\n{proc.output()[-3000:]}")
    return True


def _get(url: str, ca: Path) -> bool:
    try:
        return httpx.get(url, timeout=2, verify=str(ca)).status_code == 200
    except httpx.HTTPError:
        return False


def _ready(base: str, procs: dict[str, Proc]) -> bool:
    _alive(procs)
    try:
        r = httpx.get(f"{base}/readyz", timeout=2)
    except httpx.HTTPError:
        return False
    queues = r.json().get("queues", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
    return r.status_code == 200 and all(queues.get(f"vmsched.{op}.v2") == "ok"
                                        for op in ("discover", "filter", "score", "balance"))


def _stop(proc: Proc) -> None:
    """SIGTERM to the whole process group (plugin workers too), even when its leader was killed by a test."""
    if proc.popen is None:
        return
    for sig, wait in ((signal.SIGCONT, 0), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.popen.pid, sig)
        except ProcessLookupError:
            return
        if wait:
            try:
                proc.popen.wait(wait)
                os.killpg(proc.popen.pid, 0)  # workers left in the group: go on
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass


def _gateway_count(services: dict[str, Any]) -> tuple[float, float]:
    """The gateway's own count of requests, and of those answered with errors (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(services["gateway_metrics"], headers=AUTH, timeout=10, verify=str(services["ca"])).text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "vmsched_requests_total" and s.labels["service"] == "gateway"]
    return sum(s.value for s in samples), sum(s.value for s in samples if s.labels["outcome"] != "ok")


def _scrape_after(prom: Prometheus, since: float, timeout: float = 30) -> float:
    """The time of the gateway's first successful scrape that started after ``since``."""
    def later() -> list[float]:
        return [t for t, value in _samples(prom, 'up{component="gateway"}', since) if value == 1]

    return float(wait_until(later, timeout, 0.3, f"a gateway scrape after {since}")[0])


@pytest.fixture(scope="module")
def traffic(services: dict[str, Any]) -> dict[str, Any]:
    """Requests of every operation with good, failing and hanging units; a refused and an applied policy set.

    Brackets the requests between two of the gateway's scrapes (``t0``, ``t1``) and its own counts there."""
    api, prom = services["api"], services["prom"]
    prom.wait_for('vmsched_requests_total{service="gateway",operation="filter",outcome="ok"} == 0', "series at 0")
    prom.wait_for('up{component="agent"} == 1', "the agent scraped")
    prom.wait_for('vmsched_agent_host_cpus > 0', "the agent's first host facts")
    prom.wait_for('vmsched_facts_age_seconds{service="scoring",host="h1"}', "h1's facts in scoring's cache")
    (c0, e0) = _gateway_count(services)
    t0 = _scrape_after(prom, time.time())
    sent = 0
    with httpx.Client(base_url=api, headers=AUTH, timeout=30) as client:
        for i in range(24):
            units = ["KeepEven"] if i % 3 else ["KeepEven", "Raises"]
            replies = [client.post("/v1/filter", json={"units": units, "hosts": HOSTS}),
                       client.post("/v1/score", json={"units": [{"name": "FloatScore"}], "hosts": HOSTS})]
            if i % 6 == 0:
                replies.append(client.get("/v1/units"))
                replies.append(client.post("/v1/balance", json={"unit": "FirstHostBalance", "hosts": HOSTS,
                                                                 "properties": {"vm": "vm-1"}}))
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            sent += len(replies)
        for _ in range(2):  # killed at the 1 s plugin timeout
            r = client.post("/v1/filter", json={"units": ["Hangs"], "hosts": HOSTS})
            assert r.status_code == 200, r.text
            sent += 1
    (c1, e1) = _gateway_count(services)
    t1 = _scrape_after(prom, time.time())
    sock = str(services["work"] / "agent.sock")
    cli = [sys.executable, "-m", "vmsched.cli", "policy", "set", "test", "--socket", sock]
    refused = subprocess.run([*cli, "--dedicated", "9"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode != 0, refused.stdout
    applied = subprocess.run([*cli, "--dedicated", "2"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    prom.wait_for('sum(vmsched_agent_policy_applications_total{outcome="refused"}) >= 1', "the refusal scraped")
    prom.wait_for('sum(vmsched_agent_policy_applications_total{outcome="ok"}) >= 1', "the application scraped")
    return {"sent": sent, "c0": c0, "c1": c1, "errors": e1 - e0, "t0": t0, "t1": t1}


def test_every_dashboard_expression_parses_and_core_panels_have_data(services: dict[str, Any],
                                                                     traffic: dict[str, Any]) -> None:
    prom = services["prom"]
    results: dict[str, list[Any]] = {}
    for where, expr in dashboard_queries():
        filled = expr.replace("$__rate_interval", "1m").replace("$service", ".*")
        results[where] = results.get(where, []) + prom.query(filled)  # asserts that it parses
    empty = [title for title in CORE_PANELS if not results.get(title)]
    assert not empty, f"core panels without data: {empty}"
    assert float(prom.query('count(up{component!=""} == 0) or vector(0)')[0]["value"][1]) == 0, "nothing down yet"
    connected = {r["metric"]["service"] for r in prom.query("vmsched_bus_connected == 1")}
    assert set(SERVICES) <= connected, connected
    errors = prom.query('sum(vmsched_plugin_errors_total{unit="Raises"})')
    timeouts = prom.query('sum(vmsched_plugin_timeouts_total{unit="Hangs"})')
    assert float(errors[0]["value"][1]) >= 8 and float(timeouts[0]["value"][1]) >= 2
    fallbacks = prom.query('sum(vmsched_requests_total{service="gateway",outcome="error"})')
    assert float(fallbacks[0]["value"][1]) >= 2, "the hanging units' requests are error replies to the engine"
    # the agent rows count what happened: the applied policy set wrote the guest's metadata (libvirt's event)
    # and took 2 of the 4 dedicated CPUs (pool 4-7)
    prom.wait_for('sum(vmsched_agent_events_total{event="metadata"}) >= 1', "the policy's metadata event")
    prom.wait_for('vmsched_agent_dedicated_cpus{state="free"} == 2', "2 dedicated CPUs left free")
    memory = {r["metric"]["kind"]: float(r["value"][1]) for r in prom.query("vmsched_agent_host_memory_bytes")}
    assert 0 < memory["free"] <= memory["total"], memory
    cpu = float(prom.query("vmsched_agent_host_cpu_ratio")[0]["value"][1])
    assert 0 <= cpu <= 1, cpu
    ages = {r["metric"]["service"]: float(r["value"][1])
            for r in prom.query('vmsched_facts_age_seconds{host="h1"}')}
    assert {"scoring", "balancer"} <= set(ages) and all(age < 5 for age in ages.values()), ages


def test_overview_rate_is_the_gateways_own_count(services: dict[str, Any], traffic: dict[str, Any]) -> None:
    prom = services["prom"]
    t0, t1 = traffic["t0"], traffic["t1"]
    own = traffic["c1"] - traffic["c0"]
    assert own == traffic["sent"], "the gateway counts each request once"
    # the window runs exactly from scrape t0 to scrape t1: no extrapolation, rate x window = increase
    window_ms = round((t1 - t0) * 1000)
    overview = dict(dashboard_queries())["Request rate (engine)"]
    rate = prom.query(overview.replace("$__rate_interval", f"{window_ms}ms"), at=t1)
    seen = float(rate[0]["value"][1]) * window_ms / 1000
    assert abs(seen - own) <= 0.05 * own, (seen, own, traffic)
    assert traffic["errors"] >= 2, "the hanging units' requests are error replies"
    fallbacks = dict(dashboard_queries())["Engine fallbacks (error replies)"]
    ratio = float(prom.query(fallbacks.replace("$__rate_interval", f"{window_ms}ms"), at=t1)[0]["value"][1])
    assert abs(ratio - traffic["errors"] / own) <= 0.05 * traffic["errors"] / own, (ratio, traffic)
    # each request is counted again by the service that handled it: a sum over every service would double it
    prom.wait_for(f'sum(vmsched_requests_total{{service!="gateway"}}) >= {own}', "the services' own counts")


def test_freezing_then_killing_scoring_is_seen_within_two_scrapes(services: dict[str, Any],
                                                                  traffic: dict[str, Any]) -> None:
    prom, scoring = services["prom"], services["procs"]["scoring"]
    assert scoring.popen is not None
    rules = alerts()
    absent_expr = rules["VmschedServiceAbsent"]["expr"]
    assert not prom.query(absent_expr)
    freeze_then_kill(prom, scoring.popen, "scoring", rules["VmschedComponentDown"]["expr"], scrapes=10)
    stat = prom.query(dict(dashboard_queries())["Components down"])
    assert float(stat[0]["value"][1]) == 1, stat
    assert [r["metric"]["component"] for r in prom.query(absent_expr)] == ["scoring"], "its only replica: absent"
