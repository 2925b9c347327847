"""Every service's /metrics, scraped from real processes, against the dashboard.

Real ``vmsched`` processes are started: the all-in-one ``vmsched run`` (the
gateway's /metrics) and each worker service (``discovery``, ``scoring``,
``balancer``) with ``--metrics-port``, all on the embedded bus. Their
/metrics are parsed with prometheus-client's own parser. The Grafana
dashboard's PromQL may then only name metrics that

* a scraped process exports,
* the policy agent exports (its collectors are imported from
  services/policy_agent/metrics.py: the agent needs libvirtd to run), or
* RabbitMQ's prometheus plugin exports (RABBITMQ_METRICS below),

and only group or filter by labels those metrics carry.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import free_port
from tests.support.paths import ROOT

DASHBOARD = ROOT / "charts" / "vmsched" / "dashboards" / "vmsched.json"
WORKERS = ("discovery", "scoring", "balancer")
FRESH = "gateway before any request"

#: Series of RabbitMQ's rabbitmq_prometheus plugin that the dashboard may use,
#: with their labels when per-object metrics are on
#: (prometheus.return_per_object_metrics = true, deploy/rabbitmq/vmsched.conf).
#: Source: the plugin's prometheus_rabbitmq_core_metrics_collector.erl,
#: queue_coarse_metrics (queue_messages_ready, queue_messages_unacked,
#: queue_messages) and queue_metrics (queue_consumers), all prefixed
#: "rabbitmq_", labelled {vhost, queue}; checked against RabbitMQ 3.10-3.13.
RABBITMQ_METRICS: dict[str, set[str]] = {
    "rabbitmq_queue_messages_ready": {"vhost", "queue"},
    "rabbitmq_queue_messages_unacked": {"vhost", "queue"},
    "rabbitmq_queue_messages": {"vhost", "queue"},
    "rabbitmq_queue_consumers": {"vhost", "queue"},
}
#: Series Prometheus makes itself for every target (health panels: a dead process exports nothing).
PROMETHEUS_SERIES: dict[str, set[str]] = {"up": set()}
#: Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job", "component"}

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "inf", "nan", "atan2",
}


# --- processes -------------------------------------------------------------------------
class Process:
    def __init__(self, args: list[str], log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VMSCHED_", "OSCHEDPROXY_"))}
        # As root, plugin workers switch to an unprivileged user, who cannot read a Python under
        # /root (a pyenv install, say): tests/conftest.py then sets VMSCHED_ALLOW_ROOT_PLUGINS for the
        # processes tests start, and so do these (the sandbox's own tests cover the switch).
        if "VMSCHED_ALLOW_ROOT_PLUGINS" in os.environ:
            env["VMSCHED_ALLOW_ROOT_PLUGINS"] = os.environ["VMSCHED_ALLOW_ROOT_PLUGINS"]
        env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        self.args, self.log = args, log
        self.popen = subprocess.Popen([sys.executable, "-P", "-m", "vmsched.cli", *args], cwd=ROOT, env=env,
                                      stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(f"`vmsched {' '.join(self.args)}` exited ({self.popen.returncode}):\n"
                                 f"{self.log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        stop_group(self.popen)


class Alive(Protocol):
    def check_alive(self) -> None:
        """Raise AssertionError, with the process's output, if it has exited."""


def stop_group(popen: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group of a process started in its own session; SIGKILL after 15 s."""
    if popen.poll() is None:
        os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(5)


def wait_http(url: str, proc: Alive, timeout: float = 60.0, status: int = 200) -> httpx.Response:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        proc.check_alive()
        try:
            last = httpx.get(url, timeout=5)
            if last.status_code == status:
                return last
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{url} not answering {status} after {timeout} s (last: {last})")


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory, test_tokens_file: Path) -> Iterator[dict[str, str]]:
    """name -> /metrics text of: gateway (all-in-one, its own metrics listener), discovery, scoring, balancer,
    and FRESH: the gateway's before its first request (the workers, on their own buses, get none)."""
    from tests.support.stack import AUTH

    logs = tmp_path_factory.mktemp("metrics")
    gateway_port, gateway_metrics = free_port(), free_port()
    procs = {"gateway": Process(["run", "--host", "127.0.0.1", "--port", str(gateway_port), "--pool-size", "1",
                                 "--metrics-port", str(gateway_metrics), "--tokens-file", str(test_tokens_file)],
                                logs / "run.log")}
    worker_ports = {}
    for name in WORKERS:
        worker_ports[name] = free_port()
        procs[name] = Process([name, "--amqp", "memory://", "--metrics-port", str(worker_ports[name]),
                               "--pool-size", "1", "--consumers", "1"], logs / f"{name}.log")
    try:
        base = f"http://127.0.0.1:{gateway_port}"
        wait_http(f"{base}/readyz", procs["gateway"])
        # before any request: every series must already be there, at 0
        fresh = wait_http(f"http://127.0.0.1:{gateway_metrics}/metrics", procs["gateway"]).text
        # some traffic, so the labelled series have samples, not just HELP/TYPE
        httpx.get(f"{base}/v1/units", timeout=30, headers=AUTH)
        httpx.post(f"{base}/v1/filter", json={"units": ["HostAllowDeny", "NoSuchUnit"], "hosts": ["h1", "h2"]},
                   timeout=30, headers=AUTH)
        httpx.post(f"{base}/v1/score", json={"units": [{"name": "PreferredHosts"}], "hosts": ["h1", "h2"]},
                   timeout=30, headers=AUTH)
        httpx.post(f"{base}/v1/balance", json={"unit": "DrainHosts", "hosts": ["h1", "h2"]}, timeout=30, headers=AUTH)
        texts = {"gateway": wait_http(f"http://127.0.0.1:{gateway_metrics}/metrics", procs["gateway"]).text}
        # a worker is scraped once ready (its catalog loaded): its listener answers from before the load
        for name in WORKERS:
            wait_http(f"http://127.0.0.1:{worker_ports[name]}/readyz", procs[name])
            texts[name] = wait_http(f"http://127.0.0.1:{worker_ports[name]}/metrics", procs[name]).text
        # the probes the chart and compose use answer on the same ports
        wait_http(f"{base}/healthz", procs["gateway"], timeout=5)
        for name in WORKERS:
            wait_http(f"http://127.0.0.1:{worker_ports[name]}/healthz", procs[name], timeout=5)
        texts[FRESH] = fresh
        yield texts
    finally:
        for proc in procs.values():
            proc.stop()


# --- exported names ----------------------------------------------------------------------
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "info": ("_info",),
    "stateset": ("",),
    "gauge": ("",),
    "unknown": ("",),
}


def series_names(families: Any) -> dict[str, set[str]]:
    """Series name -> label names, for every family (with or without samples)."""
    out: dict[str, set[str]] = {}
    for fam in families:
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        for suffix in SUFFIXES[fam.type]:
            out.setdefault(fam.name + suffix, set()).update(labels)
        for s in fam.samples:
            out.setdefault(s.name, set()).update(k for k in s.labels if k != "le")
    return out


def declared_series(module: Any) -> dict[str, set[str]]:
    """Series name -> label names of the metric objects a module defines."""
    out: dict[str, set[str]] = {}
    for obj in vars(module).values():
        labelnames = getattr(obj, "_labelnames", None)
        if labelnames is None or not hasattr(obj, "describe"):
            continue
        for fam in obj.describe():
            for suffix in SUFFIXES[fam.type]:
                out[fam.name + suffix] = set(labelnames)
    assert out, f"no metrics defined in {module.__name__}"
    return out


def agent_series() -> dict[str, set[str]]:
    """The agent's metrics, from its module (the agent itself needs libvirtd to run)."""
    import vmsched.services.policy_agent.metrics as agent_metrics

    return declared_series(agent_metrics)


@pytest.fixture(scope="module")
def exported(scrapes: dict[str, str]) -> dict[str, set[str]]:
    """Series the processes exported, with their label names.

    The names come from the scrapes alone. A labelled metric that saw no
    traffic exports HELP/TYPE but no sample, so its label names are taken
    from its definition in vmsched/metrics.py.
    """
    import vmsched.metrics

    declared = declared_series(vmsched.metrics)
    names: dict[str, set[str]] = {}
    for text in scrapes.values():
        for name, labels in series_names(text_string_to_metric_families(text)).items():
            names.setdefault(name, set()).update(labels | declared.get(name, set()))
    return names


# --- PromQL ------------------------------------------------------------------------------------
def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and templating query."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\(\s*([^,]+?)\s*,\s*(\w+)\s*\)", query)
            assert m, f"templating query {query!r}"
            out.append((f"variable {var['name']}", f"{m.group(1)}{{{m.group(2)}!=\"\"}}"))
    return out


def parse_promql(expr: str) -> tuple[set[str], set[str]]:
    """Metric names and label names referenced by a PromQL expression."""
    labels: set[str] = set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors, subqueries
    for block in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", block))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        labels |= {label.strip() for label in m.group(1).split(",") if label.strip()}
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)\s*(\()?", text):
        ident, call = m.group(1), m.group(2)
        if call or ident in PROMQL_KEYWORDS:
            continue
        names.add(ident)
    return names, labels


def test_promql_parser() -> None:
    names, labels = parse_promql(
        'histogram_quantile(0.99, sum by (service, le) (rate(vmsched_x_bucket{a="b",c=~"d.*"}[$__rate_interval])))'
        ' / clamp_min(sum(rate(vmsched_y_total[5m])), 1e-9) or vector(0)'
    )
    assert names == {"vmsched_x_bucket", "vmsched_y_total"}
    assert labels == {"service", "le", "a", "c"}


# --- the tests -----------------------------------------------------------------------------------
def test_every_service_exports_the_core_metrics(scrapes: dict[str, str]) -> None:
    core = {"vmsched_requests", "vmsched_request_duration_seconds", "vmsched_bus_connected"}
    plugin = {"vmsched_plugin_calls", "vmsched_plugin_call_duration_seconds", "vmsched_plugin_errors",
              "vmsched_plugin_timeouts", "vmsched_plugin_units", "vmsched_plugin_load_errors"}
    for name, text in scrapes.items():
        families = {f.name: f for f in text_string_to_metric_families(text)}
        missing = (core | plugin) - set(families)
        assert not missing, f"{name} does not export {sorted(missing)}"
        assert families["vmsched_requests"].type == "counter"
        assert families["vmsched_request_duration_seconds"].type == "histogram"


def test_scraped_traffic_is_counted(scrapes: dict[str, str]) -> None:
    families = {f.name: f for f in text_string_to_metric_families(scrapes["gateway"])}
    samples = [s for s in families["vmsched_requests"].samples if s.name == "vmsched_requests_total"]
    services = {s.labels["service"] for s in samples}
    operations = {s.labels["operation"] for s in samples}
    assert "gateway" in services, services
    assert {"filter", "score", "balance"} <= operations, operations
    plugin_units = {s.labels["unit"] for s in families["vmsched_plugin_calls"].samples}
    assert "HostAllowDeny" in plugin_units


def test_no_host_or_vm_ids_in_label_values(scrapes: dict[str, str]) -> None:
    """vmsched/metrics.py: never a host or VM ID as a label value (cardinality)."""
    for name, text in scrapes.items():
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                assert not {"h1", "h2"} & set(s.labels.values()), (name, s)


def test_dashboard_only_uses_exported_metrics_and_labels(exported: dict[str, set[str]]) -> None:
    known = {**exported, **agent_series(), **RABBITMQ_METRICS, **PROMETHEUS_SERIES}
    queries = dashboard_queries()
    assert len(queries) > 20
    problems = []
    for where, expr in queries:
        names, labels = parse_promql(expr)
        assert names, f"{where}: no metric in {expr}"
        unknown = names - set(known)
        if unknown:
            problems.append(f"{where}: {sorted(unknown)} not exported")
            continue
        available = set().union(*(known[n] for n in names)) | TARGET_LABELS
        if any(n.endswith("_bucket") for n in names):
            available.add("le")
        if labels - available:
            problems.append(f"{where}: labels {sorted(labels - available)} not on {sorted(names)}")
    assert not problems, "\n".join(problems)


def test_dashboard_covers_red_plugins_queues_and_agents() -> None:
    used = set()
    for _, expr in dashboard_queries():
        used |= parse_promql(expr)[0]
    required = {
        # RED per operation
        "vmsched_requests_total", "vmsched_request_duration_seconds_bucket",
        # plugins: durations, errors, timeouts
        "vmsched_plugin_calls_total", "vmsched_plugin_call_duration_seconds_bucket",
        "vmsched_plugin_errors_total", "vmsched_plugin_timeouts_total",
        # queue depth and consumers per queue
        "rabbitmq_queue_messages_ready", "rabbitmq_queue_consumers",
        # agent repairs, drift, event lag, events, applications (incl. refusals), dedicated CPUs
        "vmsched_agent_repairs_total", "vmsched_agent_drift_corrections_total",
        "vmsched_agent_event_to_applied_seconds_bucket", "vmsched_agent_events_total",
        "vmsched_agent_policy_applications_total", "vmsched_agent_dedicated_cpus",
        # component health from `up` (a dead or frozen process reports nothing itself); facts staleness
        "up", "vmsched_facts_hosts_stale",
    }
    assert required <= used, sorted(required - used)
    text = DASHBOARD.read_text()
    assert "histogram_quantile(0.5," in text and "histogram_quantile(0.99," in text, "p50 and p99"


def test_dashboard_is_portable() -> None:
    """Provisioned by compose and by the Grafana sidecar alike: no fixed datasource."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "vmsched" and dashboard["title"]
    (ds_var,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["query"] == "prometheus"
    ids = []

    def walk(items: list[dict[str, Any]]) -> None:
        for p in items:
            ids.append(p["id"])
            if p["type"] != "row":
                assert p["datasource"]["uid"] == f"${{{ds_var['name']}}}", p["title"]
                for t in p["targets"]:
                    assert t["datasource"]["uid"] == f"${{{ds_var['name']}}}", p["title"]
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    assert len(ids) == len(set(ids)), "panel ids must be unique"


# --- series from start-up ----------------------------------------------------------------------
def samples_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no series {name}{labels}"
    return samples[key]


def test_request_and_plugin_series_exist_at_zero_from_start_up(scrapes: dict[str, str]) -> None:
    """Scraped before the first request: every known label set is there, at 0 (rate() and ratios hold)."""
    fresh = samples_of(scrapes[FRESH])
    for op in ("discover", "filter", "score", "balance"):
        for outcome in ("ok", "error"):
            assert value(fresh, "vmsched_requests_total", service="gateway", operation=op, outcome=outcome) == 0
        assert value(fresh, "vmsched_request_duration_seconds_count", service="gateway", operation=op) == 0
    assert value(fresh, "vmsched_bus_reconnects_total", service="gateway") == 0
    for unit in ("HostAllowDeny", "PreferredHosts", "DrainHosts"):  # loaded by the catalog, never called yet
        for outcome in ("ok", "error", "timeout"):
            assert value(fresh, "vmsched_plugin_calls_total", unit=unit, outcome=outcome) == 0
        assert value(fresh, "vmsched_plugin_errors_total", unit=unit) == 0
        assert value(fresh, "vmsched_plugin_timeouts_total", unit=unit) == 0
        assert value(fresh, "vmsched_plugin_call_duration_seconds_count", unit=unit) == 0
    assert value(fresh, "vmsched_gateway_audit_total", role="schedule", outcome="unauthenticated") == 0
    assert value(fresh, "vmsched_auth_tokens_reloads_total", outcome="error") == 0
    ops = {"discovery": ("discover",), "scoring": ("filter", "score"), "balancer": ("balance",)}
    for service, service_ops in ops.items():
        worker = samples_of(scrapes[service])
        for op in service_ops:
            for outcome in ("ok", "error", "dead_lettered"):
                assert value(worker, "vmsched_requests_total", service=service, operation=op, outcome=outcome) == 0
            assert value(worker, "vmsched_bus_expired_total", service=service, operation=op) == 0
        assert value(worker, "vmsched_bus_reconnects_total", service=service) == 0


def test_every_counter_and_histogram_has_a_series_from_start_up(scrapes: dict[str, str]) -> None:
    """No counter or histogram family is empty in a fresh process (a metric seen only after its first event
    makes rate() miss that event)."""
    for name in (FRESH, *WORKERS):
        families = {fam.name: fam for fam in text_string_to_metric_families(scrapes[name])}
        empty = {fam.name for fam in families.values() if fam.type in ("counter", "histogram") and not fam.samples}
        if not families["vmsched_facts_hosts"].samples:  # a process without a facts cache (discovery)
            empty -= {"vmsched_facts_received", "vmsched_facts_dropped"}
        assert not empty, f"{name}: no series yet for {sorted(empty)}"
    assert families_with_samples(scrapes[FRESH]) >= {"vmsched_facts_received", "vmsched_facts_dropped"}


def families_with_samples(text: str) -> set[str]:
    return {fam.name for fam in text_string_to_metric_families(text) if fam.samples}


def test_agent_series_exist_from_import() -> None:
    """The agent's counters and histograms (its module, as the agent's registry serves them) start at 0."""
    import vmsched.services.policy_agent.metrics as agent_metrics
    from prometheus_client import generate_latest

    from vmsched.metrics import REGISTRY

    samples = samples_of(generate_latest(REGISTRY).decode())
    for outcome in ("ok", "error", "refused"):
        assert ("vmsched_agent_policy_applications_total", frozenset({("outcome", outcome)})) in samples
    for event in agent_metrics.EVENT_NAMES:
        assert ("vmsched_agent_events_total", frozenset({("event", event)})) in samples
    for kind in agent_metrics.ERROR_KINDS:
        assert ("vmsched_agent_errors_total", frozenset({("kind", kind)})) in samples
    for trigger in ("tunable", "sweep", "started"):
        assert ("vmsched_agent_repairs_total", frozenset({("trigger", trigger)})) in samples


def test_buckets_resolve_the_timeouts() -> None:
    """Fine from 1 to 100 ms; around the plugin (10 s) and request (30 s) timeouts; finite past 30 s."""
    from vmsched.config import Settings
    from vmsched.metrics import LATENCY_BUCKETS

    defaults = Settings.model_fields
    plugin, request = defaults["plugin_timeout"].default, defaults["request_timeout"].default
    assert {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1} <= set(LATENCY_BUCKETS)
    for timeout in (plugin, request):
        below = [b for b in LATENCY_BUCKETS if timeout * 0.7 <= b < timeout]
        above = [b for b in LATENCY_BUCKETS if timeout < b <= timeout * 1.5]
        assert timeout in LATENCY_BUCKETS and below and above, (timeout, LATENCY_BUCKETS)
    assert {1, 1.5, 2} <= set(LATENCY_BUCKETS), "a plugin killed at ~1 s must not read as 1.75 s"


def test_overview_is_the_gateways_view() -> None:
    """The overview's request rate, error ratio and p99 count the gateway only (the engine's truth): mixing
    in the workers' series counted each request twice."""
    dashboard = json.loads(DASHBOARD.read_text())
    overview = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row" and overview:
            break
        if panel["type"] != "row":
            overview.append(panel)
    exprs = {p["title"]: p["targets"][0]["expr"] for p in overview}
    assert len(exprs) == 4, exprs
    for title, expr in exprs.items():
        if "vmsched_request" in expr:
            assert expr.count('service="gateway"') == expr.count("vmsched_request"), (title, expr)
            assert "$service" not in expr, title
    assert any(re.search(r"\bup\{", e) for e in exprs.values()), "a health stat on `up`"
    queue_exprs = [e for _, e in dashboard_queries() if "rabbitmq_queue" in e]
    assert queue_exprs and all(".(discover|filter|score|balance)" in e for e in queue_exprs), \
        "queue panels show the request queues, not the per-process reply queues"
