"""The JSON API reads I-JSON only (RFC 7493), and answers a bad request with 400 and every reason.

:class:`StrictJson` checks a JSON request body before the framework parses it:
``NaN``, ``Infinity`` and ``-Infinity`` (not JSON at all), numbers too large
for a double (``1e400``), lone surrogates (``"\\ud800"``, not Unicode; also as
raw bytes, which strict UTF-8 refuses), a body that is not UTF-8, nesting
deeper than :data:`MAX_DEPTH` and malformed JSON are refused with 400, so no
such value reaches a model, the bus or a response encoder (where they used to
end as a bare 500). :func:`invalid_request` answers every validation error of
a route the same way. The body of both is the error shape of the whole JSON
API: ``{"detail": {"code": "invalid", "error", "details": [every reason], "host"}}``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Deepest nesting of arrays and objects accepted in a request body (no request needs more than 4).
MAX_DEPTH = 32
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class Refused(ValueError):
    """A body the JSON API does not read; the message says why."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"the number {text[:40]} is too large for a double")
    return value


def _constant(name: str) -> Any:
    raise Refused(f"{name} is not a JSON value (numbers must be finite)")


def _walk(value: Any) -> str | None:
    """Why ``value`` is not I-JSON (nesting too deep, a lone surrogate), iteratively; or None."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            found = None if item.isascii() else _SURROGATE.search(item)
            if found:
                return f"a string holds a lone surrogate (U+{ord(found.group()):04X}), which is not valid Unicode"
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                return f"arrays and objects nested deeper than {MAX_DEPTH} levels"
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                item = item.values()
            stack.extend((child, depth + 1) for child in item)
    return None


def check(body: bytes) -> None:
    """Raise :class:`Refused` unless ``body`` is one I-JSON value."""
    try:
        value = json.loads(body.decode(), parse_float=_finite, parse_constant=_constant)
    except Refused:
        raise
    except RecursionError:
        raise Refused(f"arrays and objects nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as exc:  # a raw lone surrogate is not UTF-8 either
        raise Refused(f"the body is not UTF-8 (byte {exc.start}): send JSON encoded as UTF-8") from None
    except ValueError as exc:  # JSONDecodeError, an integer of over 4300 digits
        raise Refused(f"the body is not valid JSON: {str(exc)[:200]}") from None
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH or _SURROGATE_ESCAPE.search(body):
        problem = _walk(value)
        if problem:
            raise Refused(problem)


def refusal(error: str, details: list[str] | None = None, host: str | None = None) -> dict[str, Any]:
    """The JSON API's error body for an invalid request."""
    return {"detail": {"code": "invalid", "error": error, "details": details if details is not None else [error],
                       "host": host}}


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client went away before sending it."""
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def header(scope: Scope, name: bytes) -> bytes | None:
    """The value of the request's first header ``name`` (lower case), or None."""
    return next((value for key, value in scope["headers"] if key == name), None)


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole response: ``headers``, the body's content-length and ``body``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _is_json(scope: Scope) -> bool:
    # no content type: the framework reads the body as JSON
    media = (header(scope, b"content-type") or b"application/json").split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class StrictJson:
    """Refuse a request whose JSON body is not I-JSON with 400 before the app parses it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS") or not _is_json(scope):
            return await self.app(scope, receive, send)
        body = await read_body(receive)
        if body is None:
            return
        if body.strip():
            try:
                check(body)
            except Refused as exc:
                reply = JSONResponse(refusal(f"invalid JSON body: {exc}"), status_code=400)
                return await reply(scope, receive, send)
        messages = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def replay() -> Message:
            """The body read, then what the client sends next (a disconnect)."""
            return next(messages, None) or await receive()

        await self.app(scope, replay, send)


def problem(err: dict[str, Any]) -> str:
    """One validation error as ``field.path: reason`` (the input is not repeated: it may be huge or unencodable)."""
    loc = [str(p) for p in err.get("loc", ()) if p not in ("path", "body", "query")]
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{'.'.join(loc)}: {msg}" if loc else msg


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """Every validation error of a JSON route: 400 with every reason."""
    assert isinstance(exc, RequestValidationError)
    details = [problem(err) for err in exc.errors()]
    return JSONResponse(refusal("; ".join(details), details, request.path_params.get("host")), status_code=400)
