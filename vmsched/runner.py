"""Starting vmsched processes: one service, the gateway, or all of them."""

from __future__ import annotations

import logging
import signal
import threading

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from vmsched import metrics
from vmsched.config import Settings
from vmsched.gateway.app import create_app
from vmsched.gateway.http import with_read_timeouts
from vmsched.service import PluginService
from vmsched.services.balancer import BalancerService
from vmsched.services.discovery import DiscoveryService
from vmsched.services.scoring import ScoringService

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


def make_service(name: str, settings: Settings) -> PluginService:
    cls = SERVICES.get(name)
    if cls is None:
        raise ValueError(f"unknown service {name!r}")
    if cls is BalancerService:
        return BalancerService(settings, pool_size=max(1, settings.pool_size // 2))
    return cls(settings)


def _serve_http(settings: Settings) -> None:
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port, loop="uvloop",
        http=with_read_timeouts(HttpToolsProtocol, settings.header_timeout, settings.body_timeout),
        log_level=settings.log_level.lower(), access_log=False, lifespan="on", timeout_graceful_shutdown=5,
        proxy_headers=False, server_header=False, date_header=False,
    )
    uvicorn.Server(config).run()


def run_gateway(settings: Settings) -> int:
    _serve_http(settings)
    return 0


def run_service(name: str, settings: Settings) -> int:
    service = make_service(name, settings)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    service.start()
    metrics.serve(settings.metrics_port, ready=lambda: service.worker is not None and service.worker.connected)
    log.info("%s running (bus %s)", name, "embedded" if settings.embedded else "AMQP")
    stop.wait()
    service.stop()
    return 0


def run_all_in_one(settings: Settings) -> int:
    """Gateway + discovery + scoring + balancer in this process (embedded bus by default)."""
    services = [make_service(name, settings) for name in ("discovery", "scoring", "balancer")]
    for service in services:
        service.start()
    log.info("vmsched all-in-one on http://%s:%d/ (plugins %s, bus %s)", settings.host, settings.port,
             settings.plugins_dir, "embedded memory://" if settings.embedded else settings.amqp_url.split("@")[-1])
    try:
        _serve_http(settings)
    finally:
        for service in services:
            service.stop()
    return 0
