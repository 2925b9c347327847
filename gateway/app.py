"""The gateway application: XML-RPC for the engine, JSON for everyone else."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vmsched.gateway import agent_api, api, engine
from vmsched.gateway.limits import Limits
from vmsched.gateway.scheduler import Scheduler
from vmsched.gateway.strict_json import StrictJson, invalid_request
from vmsched import __version__, metrics
from vmsched.bus.client import AsyncBusClient
from vmsched.bus.connection import BusOptions
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.config import Settings

log = logging.getLogger("vmsched.gateway")


ENGINE_PATHS = frozenset({"/", "/RPC2"})


class TooLarge(BaseException):
    """Aborts an app mid-read; a BaseException so no handler's `except Exception` turns it into 200/400."""


async def refuse_too_large(send: Send, limit: int) -> None:
    body = f'{{"detail":"request body larger than {limit} bytes"}}'.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def declared_too_large(scope: Scope, limit: int) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.isdigit() and int(value) > limit
    return False


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if declared_too_large(scope, self.limit):
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
            await self.app(scope, limited, send)
        except TooLarge:
            await refuse_too_large(send, self.limit)


class EngineFastPath:
    """POST / and /RPC2 go straight to the XML-RPC handler; everything else to FastAPI.

    The engine's calls are the hot path: they skip the framework's middleware
    and routing layers, which cost as much as the rest of the request. Body
    size is limited around this app, by :class:`BodyLimit`.
    """

    def __init__(self, app: FastAPI, scheduler: Scheduler) -> None:
        self.app = app
        self.scheduler = scheduler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ENGINE_PATHS:
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        reply = await engine.handle(self.scheduler, b"".join(chunks))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/xml; charset=utf-8"),
                                (b"content-length", str(len(reply)).encode())]})
        await send({"type": "http.response.body", "body": reply})


def create_app(settings: Settings, bus: AsyncBusClient | None = None) -> BodyLimit:
    bus = bus or AsyncBusClient(BusOptions.from_settings(settings), declare=tuple(REQUEST_QUEUES.values()))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await bus.start()
        yield
        await bus.close()

    app = FastAPI(title="vmsched gateway", version=__version__, lifespan=lifespan,
                  description="oVirt external-scheduler XML-RPC at / and /RPC2; JSON API under /v1.")
    scheduler = Scheduler(bus, settings.request_timeout, Limits.from_settings(settings))
    app.state.bus = bus
    app.state.scheduler = scheduler
    app.include_router(api.router)
    app.include_router(agent_api.router)
    app.add_exception_handler(RequestValidationError, invalid_request)  # 400 with every reason, all routes
    app.add_middleware(StrictJson)  # I-JSON bodies only: no NaN, 1e400, lone surrogates

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

    return BodyLimit(EngineFastPath(app, scheduler), settings.max_body_bytes)

