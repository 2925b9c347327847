"""Prometheus metrics of every vmsched process.

The names are part of the interface: dashboards and alerts depend on them.
Conventions: ``vmsched_`` prefix, base units, ``_total`` counters,
``_seconds`` histograms, and never a host or VM ID as a label value.
"""

from __future__ import annotations

import functools
import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

#: Histogram buckets (seconds), chosen for this system (docs/deploy/monitoring.md):
#: fine from 1 ms to 100 ms, where a healthy request or plugin call lands, then dense around
#: the plugin timeout (--plugin-timeout, 10 s) and the engine's request deadline
#: (--request-timeout, 30 s), with finite buckets above 30 s so that a p99 past the deadline shows.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 12.5, 15, 20, 25, 30, 45, 60,
)
#: The metric types, made in this process's registry.
_counter = functools.partial(Counter, registry=REGISTRY)
_gauge = functools.partial(Gauge, registry=REGISTRY)
_histogram = functools.partial(Histogram, registry=REGISTRY)

# --- requests (gateway and services) ---------------------------------------
REQUESTS = _counter(
    "vmsched_requests_total",
    "Requests handled, by service, operation and outcome (ok, error; workers: dead_lettered); "
    "expired ones: vmsched_bus_expired_total",
    ["service", "operation", "outcome"],
)
REQUEST_DURATION = _histogram(
    "vmsched_request_duration_seconds",
    "Time to handle one request, by service and operation",
    ["service", "operation"],
    buckets=LATENCY_BUCKETS,
)
IN_FLIGHT = _gauge(
    "vmsched_requests_in_flight",
    "Requests being handled right now",
    ["service", "operation"],
)

# --- bus -------------------------------------------------------------------
BUS_RECONNECTS = _counter(
    "vmsched_bus_reconnects_total", "Broker (re)connections made after a failure", ["service"]
)
BUS_EXPIRED = _counter(
    "vmsched_bus_expired_total",
    "Requests dropped by a worker because the caller's deadline had passed",
    ["service", "operation"],
)
BUS_UP = _gauge("vmsched_bus_connected", "1 while the process holds a broker connection", ["service"])
BUS_RESENT = _counter(
    "vmsched_bus_resent_total",
    "Requests sent again because their connection, reply queue or publisher confirm failed before the reply "
    "(reconnect, nack, confirm_timeout); scheduling requests only, they have no side effects",
    ["service", "reason"],
)
BUS_DUPLICATE_REPLIES = _counter(
    "vmsched_bus_duplicate_replies_total",
    "Replies dropped because a re-sent request was answered already", ["service"]
)

# --- plugins ---------------------------------------------------------------
PLUGIN_CALLS = _counter(
    "vmsched_plugin_calls_total",
    "Plugin unit calls, by unit and outcome (ok, error, timeout)",
    ["unit", "outcome"],
)
PLUGIN_DURATION = _histogram(
    "vmsched_plugin_call_duration_seconds", "Duration of one plugin unit call", ["unit"], buckets=LATENCY_BUCKETS
)
PLUGIN_ERRORS = _counter("vmsched_plugin_errors_total", "Plugin calls that failed", ["unit"])
PLUGIN_TIMEOUTS = _counter(
    "vmsched_plugin_timeouts_total", "Plugin calls killed for overrunning their timeout", ["unit"]
)
PLUGIN_WORKER_RESTARTS = _counter(
    "vmsched_plugin_worker_restarts_total",
    "Plugin worker processes replaced, by reason (timeout, crash, recycle)",
    ["pool", "reason"],
)
PLUGIN_WORKERS = _gauge(
    "vmsched_plugin_workers",
    "Plugin worker processes running or starting, by pool (an adaptive pool moves between its minimum and maximum)",
    ["pool"],
)
PLUGIN_RAW_OUTPUT = _counter(
    "vmsched_plugin_raw_output_bytes_total",
    "Bytes plugin workers wrote to their fd 1/2 directly (never logged), by pool and fate (written; dropped: beyond the tail kept for diagnosis)",
    ["pool", "fate"],
)
PLUGIN_CONFINEMENT = _gauge(
    "vmsched_plugin_confinement",
    "1 when a confinement feature of the plugin workers is active (user, capabilities, landlock, seccomp, ...)",
    ["pool", "feature"],
)
PLUGIN_UNITS = _gauge("vmsched_plugin_units", "Units in the plugin catalog, by kind", ["kind"])
PLUGIN_LOAD_ERRORS = _gauge(
    "vmsched_plugin_load_errors", "Plugin files that currently fail to load"
)

# --- authentication (gateway JSON API, --metrics-auth) -------------------------
AUDIT = _counter(
    "vmsched_gateway_audit_total",
    "Calls to protected JSON API routes, by the route's role and outcome "
    "(ok, refused: 4xx, error: 5xx, unauthenticated: 401, forbidden: 403)",
    ["role", "outcome"],
)
ENGINE_REFUSED = _counter(
    "vmsched_gateway_engine_refused_total", "XML-RPC calls refused because the client is outside --engine-allow",
)
AUTH_RELOADS = _counter(
    "vmsched_auth_tokens_reloads_total", "Tokens file re-reads after a change, by outcome (ok, error: last good set kept)",
    ["outcome"],
)
AUTH_TOKENS = _gauge("vmsched_auth_tokens", "Bearer tokens in the current tokens file")
AUTH_CLIENTS = _gauge("vmsched_auth_clients", "Client-certificate subjects in the current tokens file")
TLS_RELOADS = _counter(
    "vmsched_tls_reloads_total", "Certificate/key re-reads after a change, by outcome (ok, error: last good kept)",
    ["outcome"],
)

#: Outcomes a gateway request is counted with; a worker adds dead_lettered (past the delivery limit).
GATEWAY_OUTCOMES = ("ok", "error")
WORKER_OUTCOMES = ("ok", "error", "dead_lettered")
PLUGIN_OUTCOMES = ("ok", "error", "timeout")
#: Why the gateway's bus client sends a request again (vmsched/bus/rabbitmq/client.py).
RESEND_REASONS = ("reconnect", "nack", "confirm_timeout")

for _outcome in ("ok", "error"):
    AUTH_RELOADS.labels(outcome=_outcome)
    TLS_RELOADS.labels(outcome=_outcome)


@functools.lru_cache(maxsize=8192)
def child(metric: Counter | Gauge | Histogram, *labels: str):  # type: ignore[no-untyped-def]
    """``metric.labels(*labels)``, looked up once: the request path's series (nothing here removes a series).

    The cache is bounded; a series past the bound is only looked up again, never lost."""
    return metric.labels(*labels)


def init_requests(service: str, ops: Iterable[str], worker: bool = False) -> None:
    """Create a process's request and bus series at 0, so rates and ratios hold from its first request."""
    outcomes = WORKER_OUTCOMES if worker else GATEWAY_OUTCOMES
    for op in ops:
        for outcome in outcomes:
            REQUESTS.labels(service, op, outcome)
        REQUEST_DURATION.labels(service, op)
        IN_FLIGHT.labels(service, op)
        if worker:
            BUS_EXPIRED.labels(service, op)
    if worker:
        REQUESTS.labels(service, "invalid", "error")
    # only the gateway's client re-sends scheduling requests; a worker's series stay at 0 (no empty family)
    for reason in RESEND_REASONS:
        BUS_RESENT.labels(service, reason)
    BUS_DUPLICATE_REPLIES.labels(service)
    BUS_RECONNECTS.labels(service)
    BUS_UP.labels(service)


def init_units(units: Iterable[str]) -> None:
    """Create the plugin series of each unit at 0 (called when the catalog is loaded or changes)."""
    for unit in units:
        for outcome in PLUGIN_OUTCOMES:
            PLUGIN_CALLS.labels(unit, outcome)
        PLUGIN_DURATION.labels(unit)
        PLUGIN_ERRORS.labels(unit)
        PLUGIN_TIMEOUTS.labels(unit)


log = logging.getLogger("vmsched.metrics")

#: ``authorize(headers) -> None`` when allowed, else the reason to answer 401 with.
Authorize = Callable[[dict[str, str]], "str | None"]


def serve(port: int | None, host: str = "127.0.0.1", ready: Callable[[], bool] | None = None,
          tls: ssl.SSLContext | None = None, authorize: Authorize | None = None) -> ThreadingHTTPServer | None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` (no-op when port is None).

    ``/readyz`` answers 200 while ``ready()`` is true (e.g. the worker holds a
    broker connection and is consuming), 503 otherwise. With ``tls`` the
    listener speaks HTTPS only (the handshake runs in the connection's thread).
    With ``authorize``, ``/metrics`` needs what it accepts (``/healthz`` and
    ``/readyz`` stay open for probes); a refusal is a 401 with the reason.
    """
    if port is None:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                reason = authorize({k.lower(): v for k, v in self.headers.items()}) if authorize else None
                if reason is not None:
                    body = b'{"detail":"%s"}\n' % reason.replace('"', "'").encode()
                    return self._send(401, body, "application/json", {"WWW-Authenticate": "Bearer"})
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b'{"status":"ok"}\n', "application/json")
            elif path == "/readyz":
                ok = ready() if ready is not None else True
                self._send(200 if ok else 503, b'{"ready":%s}\n' % (b"true" if ok else b"false"), "application/json")
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet probes
            pass

    server = _Server((host, port), Handler, tls)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics on %s://%s:%d/metrics", "https" if tls else "http", host, server.server_address[1])
    return server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    #: a client that stalls the TLS handshake or its request is dropped after this
    timeout_s = 10.0

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 tls: ssl.SSLContext | None) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.tls = tls
        super().__init__(address, handler)

    def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        request.settimeout(self.timeout_s)
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return  # not TLS, or a failed handshake: nothing to answer
        super().finish_request(request, client_address)  # type: ignore[arg-type]
