"""The gateway application: XML-RPC for the engine, JSON for everyone else."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vmsched.gateway import agent_api, api, facts_api
from vmsched.gateway.console import pages as console
from vmsched.gateway.decisions import api as decisions_api
from vmsched.gateway.engine import calls as engine
from vmsched.gateway.engine import xmlrpc
from vmsched.gateway.console.logouts import LogoutLink
from vmsched.gateway.console.sessions import Sessions, read_secret
from vmsched.gateway.decisions.log import DecisionLog
from vmsched.gateway.decisions.record import gateway_label
from vmsched.gateway.decisions.shadow import ShadowStore
from vmsched.gateway.docs_ui import mount_docs
from vmsched.gateway.auth import Guard, add_security_scheme
from vmsched.gateway.limits import Limits
from vmsched.decide.rules import RenderOptions
from vmsched.gateway.engine.scheduler import Scheduler
from vmsched.gateway.strict_json import StrictJson, header, invalid_request, read_body, respond
from vmsched import __version__, metrics
from vmsched.facts.subscription import FactsSubscriber
from vmsched.bus.interface import Transport
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.config import Settings
from vmsched.engine_link import facts_cache
from vmsched.tokens import TokenStore
from vmsched.whatif.format import CallRecording
from vmsched.whatif.writer import RecordWriter, record_writer

log = logging.getLogger("vmsched.gateway")


ENGINE_PATHS = frozenset({"/", "/RPC2"})
XML = [(b"content-type", b"text/xml; charset=utf-8")]


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class TooLarge(BaseException):
    """Aborts an app mid-read; a BaseException so no handler's `except Exception` turns it into 200/400."""


async def refuse_too_large(send: Send, limit: int) -> None:
    body = f'{{"detail":"request body larger than {limit} bytes"}}'.encode()
    await respond(send, 413, body, [(b"content-type", b"application/json")])


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: XML-RPC fault code of a client outside --engine-allow
FAULT_NOT_ALLOWED = 403


def allowed(client: tuple[str, int] | None, networks: list[Network]) -> bool:
    """Is the peer in one of ``networks`` (any peer when there are none)?"""
    if not networks:
        return True
    if client is None:
        return False
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:a.b.c.d is a.b.c.d
    return any(address in net for net in networks)


class Front:
    """What the gateway does before the framework: the body limit, and the engine's calls.

    A request body over ``limit`` bytes is refused with 413, declared or streamed. POST / and /RPC2 go straight
    to the XML-RPC handler; everything else to ``app`` (FastAPI). The engine's calls are the hot path: they skip
    the framework's middleware and routing layers, which cost as much as the rest of the request. The engine
    sends no credential: these two paths are open, or limited to ``networks`` (``--engine-allow``); another
    client gets an XML-RPC fault saying so.
    """

    def __init__(self, app: ASGIApp, scheduler: Scheduler, limit: int, networks: list[Network] | None = None) -> None:
        self.app = app
        self.scheduler = scheduler
        self.limit = limit
        self.networks = networks or []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = header(scope, b"content-length") or b""
        if declared.isdigit() and int(declared) > self.limit:
            return await refuse_too_large(send, self.limit)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise TooLarge()
            return message

        try:
            if scope["method"] != "POST" or scope["path"] not in ENGINE_PATHS:
                return await self.app(scope, limited, send)
            if not allowed(scope.get("client"), self.networks):
                metrics.ENGINE_REFUSED.inc()
                peer = (scope.get("client") or ("unknown",))[0]
                log.warning("XML-RPC call from %s refused: not in --engine-allow", peer)
                fault = xmlrpc.Fault(FAULT_NOT_ALLOWED, f"client {peer} is not allowed to call the scheduler "
                                                        "(the gateway's --engine-allow networks)")
                return await respond(send, 200, xmlrpc.dump_fault(fault), XML)
            body = await read_body(limited)
            if body is not None:
                await respond(send, 200, await engine.handle(self.scheduler, body), XML)
        except TooLarge:
            await refuse_too_large(send, self.limit)


def create_app(settings: Settings, transport: Transport, tokens: TokenStore | None = None,
               metrics_url: Callable[[], str | None] = lambda: None, recording: RecordWriter | None = None) -> Front:
    """The gateway's ASGI app on ``transport``, the process's bus (the runner's, shared with the services of an
    all-in-one); ``/metrics`` is served on its own listener (runner), at ``metrics_url()`` (known once that
    listener is up). ``recording``: the process's recording (the runner's); else, with ``--record``, one of its
    own."""
    tokens = tokens or TokenStore(settings.tokens_file).watch()
    bus = transport.client("gateway", declare=tuple(REQUEST_QUEUES.values()))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        parts = [part for part in (facts_sub, decision_log, shadow, own_writer, logouts) if part is not None]
        await bus.start()
        for part in parts:
            part.start()
        if logouts is not None and not sessions.shared:
            log.info("console sessions are signed with a random key of this process: they end when it stops, "
                     "and no other gateway replica accepts them (set --console-secret-file; docs/console.md)")
        yield
        for part in reversed(parts):
            part.stop()
        if recording is not None:  # the process's (the all-in-one), which may end at once on SIGTERM (uvicorn)
            recording.flush()
        if facts is not None and facts.link is not None:
            facts.link.stop()
        await bus.close()

    facts = facts_cache(settings, "gateway")
    facts_sub = FactsSubscriber(transport, "gateway", facts.ingest) if facts else None

    app = FastAPI(title="vmsched gateway", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="oVirt external-scheduler XML-RPC at / and /RPC2; JSON API under /v1. "
                              "Every /v1 route needs a bearer token with the role it names (docs/api-auth.md).")
    label = gateway_label(settings.gateway_id)
    decision_log = DecisionLog(settings.decisions_size, label, facts, transport if settings.decisions_share else None,
                               settings.decisions_log)
    shadow = ShadowStore(transport)  # the shadow candidates' comparisons, joined to decisions by ID
    own_writer = record_writer(settings, "gateway") if recording is None else None
    writer = recording or own_writer
    scheduler = Scheduler(bus, settings.request_timeout,
                          Limits(settings.max_hosts, settings.max_units, settings.max_string),
                          decision_log.submit if settings.decisions_size else None,
                          RenderOptions(score_per_unit=settings.score_per_unit),
                          CallRecording(writer, label, _items(settings.record_omit))
                          if writer is not None else None)
    secret_file = settings.console_secret_file
    sessions = Sessions(read_secret(secret_file) if secret_file else None, tokens, ttl=settings.console_session_ttl)
    logouts = (LogoutLink(transport, label, sessions.logouts)
               if transport.spans_processes else None)  # the in-process bus: one process, one gateway
    app.state.console_sessions = sessions
    app.state.console_logouts = logouts
    app.state.decisions = decision_log
    app.state.shadow = shadow
    app.state.whatif_reports = settings.whatif_reports
    app.state.bus = bus
    app.state.scheduler = scheduler
    app.state.facts = facts
    for router in (api.router, agent_api.router, facts_api.router, decisions_api.router):
        app.include_router(router)
    mount_docs(app)  # /docs from package assets, offline
    app.include_router(console.router)  # GET / (the engine only POSTs there), /login
    app.state.tokens = tokens
    app.add_exception_handler(RequestValidationError, invalid_request)  # 400 with every reason, all routes
    app.add_middleware(StrictJson)  # I-JSON bodies only: no NaN, 1e400, lone surrogates

    @app.get("/healthz", tags=["operations"], summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics_here() -> JSONResponse:
        """Where the metrics listener is."""
        url = metrics_url()
        return JSONResponse({"detail": f"/metrics is not served on this port: see {url or 'its own listener'} (the "
                                       "gateway's metrics listener: --metrics-host and --metrics-port, default "
                                       "127.0.0.1:9100)", "metrics": url}, status_code=404)

    @app.get("/readyz", tags=["operations"],
             summary="The bus is reachable and at least one service consumer answers (per-queue detail)")
    async def readyz() -> JSONResponse:
        if not bus.connected:
            return JSONResponse({"ready": False, "bus": bus.last_error or "disconnected"}, status_code=503)
        names = list(REQUEST_QUEUES.values())
        answers = await asyncio.gather(*(bus.ping(q, timeout=1.0) for q in names))
        queues = {q: ("ok" if ok else "no consumer answered within 1 s") for q, ok in zip(names, answers)}
        ready = any(answers)
        return JSONResponse({"ready": ready, "bus": "connected", "queues": queues}, status_code=200 if ready else 503)

    add_security_scheme(app)
    return Front(Guard(app, tokens, sessions), scheduler, settings.max_body_bytes, settings.engine_networks)
