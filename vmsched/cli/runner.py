"""Starting vmsched processes: one service, the gateway, or all of them."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Callable

import uvicorn

from vmsched import logs, metrics
from vmsched.bus.options import BusOptions
from vmsched.bus.interface import Transport
from vmsched.bus.transport import open_transport
from vmsched.config import Settings
from vmsched.gateway.app import create_app
from vmsched.gateway.http import gateway_http
from vmsched.messages import Op
from vmsched.cli.preflight import bind, cannot_listen, check_plugins, check_tokens
from vmsched.service import PluginService
from vmsched.services.balancer import BalancerService
from vmsched.services.discovery import DiscoveryService
from vmsched.services.scoring import ScoringService
from vmsched.tls import server_context
from vmsched.tokens import Role, TokenStore, bearer_authorizer
from vmsched.whatif.writer import RecordWriter, record_writer

log = logging.getLogger("vmsched")


#: The scheduling services, by command name.
SERVICES: dict[str, type[PluginService]] = {
    "discovery": DiscoveryService,
    "scoring": ScoringService,
    "balancer": BalancerService,
}


def service_queues() -> dict[str, tuple[str, ...]]:
    """The queues each service consumes, as the services declare them."""
    return {name: tuple(cls.QUEUES) for name, cls in SERVICES.items()}


def make_service(name: str, settings: Settings, transport: Transport, log_plugins: bool = True,
                 recording: RecordWriter | None = None) -> PluginService:
    """Service ``name`` on ``transport``, the process's bus, recording to ``recording`` (the process's; default:
    with ``--record``, one of its own)."""
    cls = SERVICES.get(name)
    if cls is None:
        raise ValueError(f"unknown service {name!r}")
    if cls is BalancerService:
        fewest, most = settings.pool_bounds()
        half = max(1, most // 2)  # balance requests are rarer: half the workers
        return BalancerService(settings, transport, pool_bounds=(min(fewest, half), half), log_plugins=log_plugins,
                               recording=recording)
    if cls is DiscoveryService:  # it runs no unit: nothing to record
        return DiscoveryService(settings, transport, log_plugins=log_plugins)
    return cls(settings, transport, log_plugins=log_plugins, recording=recording)


#: The gateway's /metrics port when --metrics-port is not given (services: no listener).
GATEWAY_METRICS_PORT = 9100


def serve_metrics(settings: Settings, ready: Callable[[], bool] | None = None, default_port: int | None = None,
                  tokens: TokenStore | None = None) -> ThreadingHTTPServer | None:
    """The metrics listener of a process: --metrics-host/-port, optional TLS and --metrics-auth."""
    port = settings.metrics_port if settings.metrics_port is not None else default_port
    tls = server_context(settings.metrics_tls_cert, settings.metrics_tls_key, what="metrics TLS")
    authorize = None
    if settings.metrics_auth:
        if settings.tokens_file is None:
            raise ValueError("--metrics-auth needs --tokens-file (tokens with the read role may scrape)")
        authorize = bearer_authorizer(tokens or TokenStore(settings.tokens_file).watch(), Role.READ)
    try:
        return metrics.serve(port, settings.metrics_host, ready, tls, authorize)
    except OSError as exc:
        raise cannot_listen("the metrics listener", settings.metrics_host, port, exc, "--metrics-port") from None


def _prepare_http(settings: Settings, transport: Transport,
                  recording: RecordWriter | None = None) -> tuple[uvicorn.Server, socket.socket]:
    """The gateway's HTTP server and its bound socket (the metrics listener too): nothing served yet."""
    check_tokens(settings)
    tls = server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca, what="gateway TLS")
    tokens = TokenStore(settings.tokens_file).watch()
    metrics_url: list[str] = []  # known once the metrics listener is up, below
    app = create_app(settings, transport, tokens=tokens, metrics_url=lambda: next(iter(metrics_url), None),
                     recording=recording)
    metrics.init_requests("gateway", [op.value for op in Op])  # every series at 0 from start-up
    sock = bind(settings.host, settings.port)
    try:
        listener = serve_metrics(settings, default_port=GATEWAY_METRICS_PORT, tokens=tokens)
    except BaseException:
        sock.close()
        raise
    if listener is not None:
        scheme = "https" if settings.metrics_tls_cert else "http"
        metrics_url.append(f"{scheme}://{settings.metrics_host}:{listener.server_address[1]}/metrics")
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, loop="uvloop",
        http=gateway_http(settings.header_timeout, settings.body_timeout),
        log_level=settings.log_level.lower(), log_config=None,  # uvicorn's lines in the process's format
        access_log=False, lifespan="on", timeout_graceful_shutdown=5,
        proxy_headers=False, server_header=False, date_header=False,
        ssl_context_factory=(lambda _config, _default: tls) if tls is not None else None,
    )
    return uvicorn.Server(config), sock


def _transport(settings: Settings, broker_from: str) -> Transport:
    """The process's bus, chosen once from the broker URL and handed to every party of the process; which broker
    and where it was named (``broker_from``) is logged, never its password."""
    if not settings.embedded:
        log.info("bus: RabbitMQ at %s, from %s", logs.broker(settings.amqp_url), broker_from)
    return open_transport(BusOptions.from_settings(settings))


def run_gateway(settings: Settings, broker_from: str = "the settings") -> int:
    server, sock = _prepare_http(settings, _transport(settings, broker_from))
    server.run(sockets=[sock])
    return 0


def run_service(name: str, settings: Settings, broker_from: str = "the settings") -> int:
    check_plugins(settings)
    service = make_service(name, settings, transport=_transport(settings, broker_from))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve_metrics(settings, ready=lambda: service.worker is not None and service.worker.connected)
    service.start()
    log.info("%s running (bus %s)", name, "embedded" if settings.embedded else "AMQP")
    stop.wait()
    service.stop()
    return 0


def run_all_in_one(settings: Settings, broker_from: str = "the settings") -> int:
    """Gateway + discovery + scoring + balancer in this process (embedded bus by default)."""
    check_plugins(settings)
    transport = _transport(settings, broker_from)  # memory://: the one in-process bus of the gateway and the services
    recording = record_writer(settings, "run")  # one recording of the process (--record)
    server, sock = _prepare_http(settings, transport, recording)  # a busy port fails here, before any service starts
    services = [make_service(name, settings, log_plugins=name == "discovery",  # each plugin load logged once
                             transport=transport, recording=recording) for name in ("discovery", "scoring", "balancer")]
    if recording is not None:
        recording.start()
    for service in services:
        service.start()
    log.info("vmsched all-in-one on %s://%s:%d/ (plugins %s, bus %s)", "https" if settings.tls_cert else "http",
             settings.host, sock.getsockname()[1], " and ".join(map(str, settings.plugin_folders)),
             "embedded memory://" if settings.embedded else logs.broker(settings.amqp_url))
    try:
        server.run(sockets=[sock])
    finally:
        for service in services:
            service.stop()
        if recording is not None:
            recording.stop()
    return 0
