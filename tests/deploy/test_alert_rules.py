"""The shipped alert rules (charts/vmsched/rules/vmsched.yaml) under Debian's promtool.

``promtool check rules`` validates the file; ``promtool test rules`` runs
tests/prometheus/*.test.yaml, which together must hold a firing and a quiet
case for every alert. Every alert names its runbook entry in docs/deploy/monitoring.md,
only uses metrics that vmsched, RabbitMQ's plugin or Prometheus (``up``)
export, and the chart ships the same rules as a PrometheusRule.

promtool comes from Debian's ``prometheus`` package, installed here by
scripts/apt-install when missing; where it cannot be installed the tests skip
and say why, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT

RULES = ROOT / "charts" / "vmsched" / "rules" / "vmsched.yaml"
RULE_TESTS = sorted((ROOT / "tests" / "prometheus").glob("*.test.yaml"))
DOCS = ROOT / "docs" / "deploy" / "monitoring.md"


def prometheus_tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus`` (Debian's package), installing it if needed."""
    found = shutil.which(name)
    if found:
        return found
    proc = subprocess.run([str(ROOT / "scripts" / "apt-install"), "prometheus"], capture_output=True, text=True,
                          timeout=600)
    found = shutil.which(name)
    if found:
        return found
    reason = f"Debian's prometheus package ({name}) could not be installed: {proc.stderr.strip() or proc.stdout.strip()}"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def promtool() -> str:
    return prometheus_tool("promtool")


def alerts() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    out = {rule["alert"]: rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule}
    assert len(out) >= 14, sorted(out)
    return out


def test_promtool_check_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_promtool_test_rules(promtool: str) -> None:
    assert len(RULE_TESTS) >= 2, RULE_TESTS
    proc = subprocess.run([promtool, "test", "rules", *(path.name for path in RULE_TESTS)], capture_output=True,
                          text=True, timeout=120, cwd=RULE_TESTS[0].parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(RULE_TESTS), proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    tests = [test for path in RULE_TESTS for test in yaml.safe_load(path.read_text())["tests"]]
    firing, quiet = set(), set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = set(alerts())
    assert names - firing == set(), f"no firing case for {sorted(names - firing)}"
    assert names - quiet == set(), f"no quiet case for {sorted(names - quiet)}"
    assert (firing | quiet) <= names, f"tests of unknown alerts: {sorted((firing | quiet) - names)}"


def test_every_alert_has_a_runbook_entry() -> None:
    headings = {m.group(1) for m in re.finditer(r"^#### (Vmsched\w+)\s*$", DOCS.read_text(), re.M)}
    for name, rule in alerts().items():
        assert rule["annotations"]["runbook"] == f"docs/deploy/monitoring.md#{name.lower()}", name
        assert name in headings, f"docs/deploy/monitoring.md has no runbook heading '#### {name}'"
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_alerts_only_use_exported_metrics() -> None:
    """Every metric an alert reads is exported by vmsched (its processes, the agent, the facts cache),
    by RabbitMQ's prometheus plugin, or is Prometheus's own ``up``."""
    import vmsched.metrics
    from tests.deploy.test_metrics import RABBITMQ_METRICS, agent_series, declared_series, parse_promql

    known = {*declared_series(vmsched.metrics), *agent_series(), *RABBITMQ_METRICS, "up",
             "vmsched_facts_hosts_stale"}
    for name, rule in alerts().items():
        used = parse_promql(rule["expr"])[0]
        assert used, name
        assert used <= known, f"{name}: {sorted(used - known)} exported by nothing"


@pytest.fixture(scope="module")
def chart() -> Any:
    import helm_python as helm

    with helm.Chart.load(ROOT / "charts" / "vmsched") as loaded:
        yield loaded


def test_the_chart_ships_the_rules_as_a_prometheus_rule(chart: Any) -> None:
    from tests.deploy.test_chart import render

    assert not [d for d in render(chart, {}) if d["kind"] == "PrometheusRule"], "opt-in"
    docs = render(chart, {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES.read_text()), "the same rules as compose and systemd load"
    # $labels templates reach Prometheus untouched (not rendered by Helm)
    assert "{{ $labels.instance }}" in yaml.safe_dump(rule["spec"], width=1000)


def test_broker_pod_monitor_scrapes_the_queue_metrics(chart: Any) -> None:
    from tests.deploy.test_chart import render

    assert not [d for d in render(chart, {}) if d["kind"] == "PodMonitor"], "opt-in"
    docs = render(chart, {"brokerMonitor": {"enabled": True, "namespace": "rabbitmq", "port": "prometheus"}})
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["rabbitmq"]}
    assert pm["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "rabbitmq"}}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "prometheus" and endpoint["path"] == "/metrics"
    assert {"targetLabel": "component", "replacement": "rabbitmq"} in endpoint["relabelings"]
    assert _seconds(endpoint["scrapeTimeout"]) < _seconds(endpoint["interval"])


def test_service_monitor_sets_the_component_label(chart: Any) -> None:
    from tests.deploy.test_chart import render

    (sm,) = [d for d in render(chart, {"serviceMonitor": {"enabled": True}}) if d["kind"] == "ServiceMonitor"]
    for endpoint in sm["spec"]["endpoints"]:
        assert {"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_component"],
                "targetLabel": "component"} in endpoint["relabelings"]
        assert _seconds(endpoint["scrapeTimeout"]) < _seconds(endpoint["interval"]), "a frozen process must drop `up`"


def _seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", duration)
    assert m, duration
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_every_dashboard_expression_parses(promtool: str, tmp_path: Path) -> None:
    """Each panel's PromQL (Grafana's variables filled in) parses in Prometheus's own parser."""
    from tests.deploy.test_metrics import dashboard_queries

    queries = dashboard_queries()
    fill = {"$__rate_interval": "1m", "$__interval": "15s", "$service": ".*"}
    rules = []
    for i, (where, expr) in enumerate(queries):
        for var, value in fill.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{where}: unknown variable in {expr}"
        rules.append({"record": f"dashboard:panel_{i}", "expr": expr})
    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the scrape configuration: one template (scripts/prometheus-config) -------------------------------------
def prometheus_config(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "prometheus-config"), *args], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("form, path", [("compose", "deploy/prometheus/prometheus.yml"),
                                        ("systemd", "deploy/systemd/prometheus.yml")])
def test_checked_in_configs_come_from_the_template(form: str, path: str, promtool: str) -> None:
    text = prometheus_config(form)
    assert (ROOT / path).read_text() == text, f"{path} differs: run scripts/prometheus-config {form} > {path}"
    config = yaml.safe_load(text)
    assert _seconds(config["global"]["scrape_timeout"]) < _seconds(config["global"]["scrape_interval"])
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yaml"]
    components = {rc["replacement"] for job in config["scrape_configs"] for rc in job.get("relabel_configs", [])
                  if rc.get("target_label") == "component"}
    components |= {sc["labels"]["component"] for job in config["scrape_configs"]
                   for sc in job.get("static_configs", []) if "labels" in sc}
    assert components == {"gateway", "discovery", "scoring", "balancer", "agent", "rabbitmq"}
    proc = subprocess.run([promtool, "check", "config", "--syntax-only", str(ROOT / path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_local_config_with_token_and_tls(promtool: str, tmp_path: Path) -> None:
    text = prometheus_config("local", "--target", "gateway=127.0.0.1:9100", "--target", "scoring=127.0.0.1:9102",
                             "--agents-dir", "/etc/prometheus/agents",
                             "--token-file", "/etc/prometheus/vmsched-metrics.token", "--ca-file", "/etc/ca.pem")
    config = yaml.safe_load(text)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"vmsched-gateway", "vmsched-scoring", "vmsched-agent"}  # agents: --metrics-tokens-file
    for job in jobs.values():
        assert job["scheme"] == "https" and job["tls_config"] == {"ca_file": "/etc/ca.pem"}
        assert job["authorization"] == {"credentials_file": "/etc/prometheus/vmsched-metrics.token"}
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    proc = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scrape_timeout_must_be_below_the_interval() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "prometheus-config"), "local", "--interval", "10s",
                           "--timeout", "10s"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "must be below the interval" in proc.stderr
