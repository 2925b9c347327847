"""The gateway application: XML-RPC for the engine, JSON for everyone else."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import api, engine
from gateway.scheduler import Scheduler
from vmsched import __version__, metrics
from vmsched.bus.client import AsyncBusClient
from vmsched.bus.connection import BusOptions
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.config import Settings

log = logging.getLogger("vmsched.gateway")


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                return await self._refuse(send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = f'{{"detail":"request body larger than {self.limit} bytes"}}'.encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(BaseException):
    """Aborts the app mid-read; a BaseException so no handler's `except Exception` turns it into 200/400."""


def create_app(settings: Settings, bus: AsyncBusClient | None = None) -> FastAPI:
    bus = bus or AsyncBusClient(BusOptions.from_settings(settings), declare=tuple(REQUEST_QUEUES.values()))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await bus.start()
        yield
        await bus.close()

    app = FastAPI(title="vmsched gateway", version=__version__, lifespan=lifespan,
                  description="oVirt external-scheduler XML-RPC at / and /RPC2; JSON API under /v1.")
    app.state.bus = bus
    app.state.scheduler = Scheduler(bus, settings.request_timeout)
    app.add_route("/", engine.endpoint, methods=["POST"], include_in_schema=False)
    app.add_route("/RPC2", engine.endpoint, methods=["POST"], include_in_schema=False)
    app.include_router(api.router)
    _include_agent_api(app)

    @app.get("/healthz", tags=["operations"], summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

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

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics")
    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app


def _include_agent_api(app: FastAPI) -> None:
    try:
        from gateway.agent_api import router
    except ImportError as exc:  # the agent API is optional in minimal installs
        log.info("agent API not available: %s", exc)
        return
    app.include_router(router)
