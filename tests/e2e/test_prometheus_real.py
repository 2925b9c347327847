"""A real Prometheus (Debian's package) against real vmsched processes: the dashboard and the health signal.

Started here: the all-in-one ``vmsched run`` (the gateway's metrics behind --metrics-auth, scraped with the
tests' read token), a separate ``scoring`` service, and a policy agent on libvirt's in-process test driver
(``test:///default``, no libvirtd), all scraped by a Prometheus on a private port whose configuration comes
from the one template (scripts/prometheus-config local) with the shipped alert rules. Traffic includes
failing and hanging plugin units and a refused ``policy set``. Then:

* every dashboard expression parses in Prometheus (its HTTP API), and the core panels return data;
* the overview's counter is the gateway's own count of the requests sent (the workers' series would double it);
* freezing (SIGSTOP) and then killing the scoring service makes the "component down" expression true, at the
  first or second scrape after the freeze (counted in scrapes, from Prometheus's own samples).

Heavy (a Prometheus server, four processes): marked ``slow``; every wait is bounded.
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

from tests.support.stack import AUTH, TEST_TOKEN
from tests.support.waiting import wait_until
from tests.deploy.test_alert_rules import ROOT, RULES, prometheus_tool
from tests.deploy.test_metrics import Process, dashboard_queries, free_port, stop_group, wait_http

pytestmark = pytest.mark.slow

INTERVAL_S = 2  # scrape interval of this test's Prometheus; the timeout is 1 s (below it)
PLUGINS = ROOT / "tests" / "plugins"
HOSTS = ["h1", "h2", "h3", "h4"]


class Prometheus:
    def __init__(self, binary: str, config: Path, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self.popen = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")

    def wait_ready(self, timeout: float = 60) -> None:
        try:
            wait_http(f"{self.url}/-/ready", self, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log.read_text()[-3000:]}") from None

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr, **({"time": str(at)} if at is not None else {})}
        r = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error', r.text)}"
        return body["data"]["result"]

    def wait_for(self, expr: str, what: str, timeout: float = 60) -> list[dict[str, Any]]:
        """The first non-empty result of ``expr``, queried every 0.5 s for at most ``timeout`` s."""
        result: list[dict[str, Any]] = wait_until(lambda: self.query(expr), timeout, 0.5, f"{what}: {expr}")
        return result

    def stop(self) -> None:
        stop_group(self.popen)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, test_tokens_file: Path) -> Iterator[dict[str, Any]]:
    binary = prometheus_tool("prometheus")
    work = tmp_path_factory.mktemp("prometheus-real")
    api, ports = free_port(), {name: free_port() for name in ("gateway", "scoring", "agent")}
    common = ["--plugins", str(PLUGINS), "--plugin-timeout", "1", "--pool-size", "2"]
    procs = {
        "gateway": Process(["run", "--host", "127.0.0.1", "--port", str(api), "--metrics-port", str(ports["gateway"]),
                            "--metrics-auth", "--tokens-file", str(test_tokens_file), *common], work / "run.log"),
        "scoring": Process(["scoring", "--amqp", "memory://", "--metrics-port", str(ports["scoring"]), "--consumers",
                            "1", *common], work / "scoring.log"),
        "agent": Process(["agent", "--libvirt", "test:///default", "--host-id", "h1", "--state-dir", str(work / "state"),
                          "--lock-dir", str(work / "lock"), "--socket", str(work / "agent.sock"), "--dedicated-pool",
                          "4-7", "--metrics-port", str(ports["agent"])], work / "agent.log"),
    }
    token, agents = scrape_files(work, ports["agent"])
    gateway_config = _config("--target", f"gateway=127.0.0.1:{ports['gateway']}", "--token-file", str(token))
    rest = _config("--target", f"scoring=127.0.0.1:{ports['scoring']}", "--agents-dir", str(agents))
    # one file: the gateway's job (token) and the others (no --metrics-auth on them); rules: the shipped file
    config = work / "prometheus.yml"
    config.write_text(gateway_config.replace("scrape_configs:\n", "scrape_configs:\n" + rest.split("scrape_configs:\n", 1)[1], 1))
    prom = Prometheus(binary, config, work)
    try:
        wait_http(f"http://127.0.0.1:{api}/readyz", procs["gateway"])
        wait_http(f"http://127.0.0.1:{ports['scoring']}/readyz", procs["scoring"])
        wait_http(f"http://127.0.0.1:{ports['agent']}/healthz", procs["agent"])
        prom.wait_ready()
        yield {"prom": prom, "procs": procs, "api": f"http://127.0.0.1:{api}", "auth": AUTH, "work": work,
               "metrics": f"http://127.0.0.1:{ports['gateway']}/metrics"}
    finally:
        prom.stop()
        for proc in procs.values():
            proc.stop()


def scrape_files(work: Path, agent_port: int) -> tuple[Path, Path]:
    """The read token's file (mode 0600, for --token-file) and an agents folder naming one agent (--agents-dir)."""
    token = work / "read.token"
    token.write_text(TEST_TOKEN)
    token.chmod(0o600)
    agents = work / "agents"
    agents.mkdir()
    (agents / "local.yml").write_text(f'- targets: ["127.0.0.1:{agent_port}"]\n')
    return token, agents


def _config(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "prometheus-config"), "local", "--rules", str(RULES),
                           "--interval", f"{INTERVAL_S}s", "--timeout", "1s", *args],
                          capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout


@pytest.fixture(scope="module")
def traffic(stack: dict[str, Any]) -> dict[str, Any]:
    """Scheduling requests with good, failing and hanging units; a refused policy set; then two scrapes."""
    api, auth, prom = stack["api"], stack["auth"], stack["prom"]
    # a scrape before the first request: the series exist at 0 from start-up, so rate() sees the whole burst
    prom.wait_for('vmsched_requests_total{service="gateway",operation="filter",outcome="ok"} == 0', "series at 0")
    prom.wait_for('up{component="agent"} == 1', "the agent scraped")
    sent = 0
    with httpx.Client(base_url=api, headers=auth, timeout=30) as client:
        for i in range(30):
            units = ["KeepEven"] if i % 3 else ["KeepEven", "Raises"]
            r = client.post("/v1/filter", json={"units": units, "hosts": HOSTS})
            assert r.status_code == 200, r.text
            r = client.post("/v1/score", json={"units": [{"name": "FloatScore"}], "hosts": HOSTS})
            assert r.status_code == 200, r.text
            sent += 2
        for _ in range(2):  # killed at the 1 s plugin timeout
            r = client.post("/v1/filter", json={"units": ["Hangs"], "hosts": HOSTS})
            assert r.status_code == 200, r.text
            sent += 1
    sock = stack["work"] / "agent.sock"
    refused = subprocess.run([sys.executable, "-m", "vmsched.cli", "policy", "set", "test", "--dedicated", "9",
                              "--socket", str(sock)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode != 0, refused.stdout
    applied = subprocess.run([sys.executable, "-m", "vmsched.cli", "policy", "set", "test", "--dedicated", "2",
                              "--socket", str(sock)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    own = _gateway_count(stack)
    prom.wait_for(f'sum(vmsched_requests_total{{service="gateway"}}) >= {own}', "the last requests scraped")
    prom.wait_for(f'count_over_time(up{{component="gateway"}}[{3 * INTERVAL_S}s]) >= 2', "one more scrape")
    prom.wait_for('sum(vmsched_agent_policy_applications_total{outcome="refused"}) >= 1', "the refusal scraped")
    return {"sent": sent, "own": own}


def _gateway_count(stack: dict[str, Any]) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(stack["metrics"], headers=stack["auth"], timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "vmsched_requests_total" and s.labels["service"] == "gateway")


def test_every_dashboard_expression_parses_and_core_panels_have_data(stack: dict[str, Any], traffic: dict[str, Any]) -> None:
    prom = stack["prom"]
    results = {}
    for where, expr in dashboard_queries():
        filled = expr.replace("$__rate_interval", "1m").replace("$service", ".*")
        results[where] = results.get(where, []) + prom.query(filled)
    core = ["Request rate (engine)", "Engine fallbacks (error replies)", "p99 request duration (engine)",
            "Components down", "p50 duration", "p99 duration", "Plugin calls by unit and outcome",
            "Plugin errors and timeouts", "Bus connections", "Targets up by component",
            "Policy applications (ok, error, refused) and errors", "Repairs by trigger", "libvirt events",
            "Dedicated CPUs free per host"]
    empty = [title for title in core if not results.get(title)]
    assert not empty, f"core panels without data: {empty}"
    down = prom.query('count(up{component!=""} == 0) or vector(0)')
    assert float(down[0]["value"][1]) == 0, "nothing is down yet"
    errors = prom.query('sum(vmsched_plugin_errors_total{unit="Raises"})')
    timeouts = prom.query('sum(vmsched_plugin_timeouts_total{unit="Hangs"})')
    assert float(errors[0]["value"][1]) >= 10 and float(timeouts[0]["value"][1]) >= 2
    assert not prom.query("vmsched_agent_host_cpus"), "an agent without a bus collects no host facts: no gauges, not zeros"


def test_overview_counts_what_the_gateway_counts(stack: dict[str, Any], traffic: dict[str, Any]) -> None:
    prom = stack["prom"]
    gateway = float(prom.query('sum(vmsched_requests_total{service="gateway"})')[0]["value"][1])
    everything = float(prom.query("sum(vmsched_requests_total)")[0]["value"][1])
    assert abs(gateway - traffic["sent"]) <= 0.05 * traffic["sent"], (gateway, traffic)
    assert abs(gateway - traffic["own"]) <= 0.05 * traffic["own"], (gateway, traffic)
    assert everything > 1.5 * gateway, "in the all-in-one each request is counted by the gateway and its worker"
    rate = prom.query('sum(rate(vmsched_requests_total{service="gateway"}[1m]))')
    assert rate and float(rate[0]["value"][1]) > 0


def test_freezing_then_killing_scoring_is_seen_within_two_scrapes(stack: dict[str, Any], traffic: dict[str, Any]) -> None:
    down_expr = 'up{component="scoring"} == 0'  # VmschedComponentDown's expression
    freeze_then_kill(stack["prom"], stack["procs"]["scoring"].popen, "scoring", down_expr, scrapes=30)


def freeze_then_kill(prom: Prometheus, popen: subprocess.Popen[bytes], component: str, down_expr: str,
                     scrapes: int) -> None:
    """SIGSTOP ``popen`` (the only target of ``component``), then SIGKILL it; assert what Prometheus sees.

    ``down_expr`` names no target before, and only ``component`` after: frozen, its ``up`` falls at the scrape in
    flight at the freeze (its sample is stamped when it started, before the freeze) or at the first or second that
    started after it (the one in flight may still succeed); killed, its next two
    scrapes or more read 0. Every wait is bounded by ``scrapes`` scrape intervals."""
    selector = f'up{{component="{component}"}}'
    bound = scrapes * INTERVAL_S
    assert not prom.query(down_expr)
    frozen_at = time.time()
    os.kill(popen.pid, signal.SIGSTOP)
    try:
        prom.wait_for(down_expr, f"a frozen {component} service", timeout=bound)
        # a scrape in flight at the freeze (started up to one interval before it) may succeed, or fail at once
        in_flight = [(t, v) for t, v in _samples(prom, selector, frozen_at - INTERVAL_S) if t <= frozen_at]
        samples = _samples(prom, selector, frozen_at)
        if not any(value == 0 for _, value in in_flight):
            first_down = next((i for i, (_, value) in enumerate(samples) if value == 0), None)
            assert first_down is not None and first_down <= 1, \
                f"up did not fall at the first or second scrape after the freeze at {frozen_at}: {in_flight} {samples}"
        down = _components(prom, down_expr)
        assert down == [component], f"only {component} is down: {down}"
        os.kill(popen.pid, signal.SIGKILL)
        popen.wait(10)
    finally:
        if popen.poll() is None:
            os.kill(popen.pid, signal.SIGCONT)
    killed_at = time.time()

    def two_scrapes() -> list[tuple[float, float]]:
        after = _samples(prom, selector, killed_at)
        return after if len(after) >= 2 else []

    after_kill = wait_until(two_scrapes, bound, 0.3, f"two scrapes of {component} after the kill")
    assert all(value == 0 for _, value in after_kill), after_kill
    assert _components(prom, down_expr) == [component], "still down once killed"


def _components(prom: Prometheus, expr: str) -> list[str]:
    return [r["metric"]["component"] for r in prom.query(expr)]


def _samples(prom: Prometheus, selector: str, since: float) -> list[tuple[float, float]]:
    """The target's scrapes that started after ``since`` (a scrape in flight at the freeze may still succeed)."""
    result = prom.query(f"{selector}[5m]")
    assert len(result) == 1, result
    return [(float(t), float(v)) for t, v in result[0]["values"] if float(t) > since]
