"""``/docs`` from package assets (``fastapi-offline``), so it works without internet access.

Swagger UI 5 (OpenAPI 3.1, as FastAPI writes it) loads from ``/docs/assets/``
and is started by a static script from ``/static/`` (no inline script: a
strict Content-Security-Policy). Both prefixes are open
(:data:`vmsched.gateway.auth.OPEN_PREFIXES`): they hold no data. ``/redoc``
is off: the packaged ReDoc still fetches its logo from the vendor's CDN.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"
ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; font-src 'self'; worker-src 'self' blob:; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": DOCS_CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
DOCS_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>vmsched gateway - API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="/docs/assets/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/static/docs-init.js"></script>
</body>
</html>
"""


def mount_docs(app: FastAPI) -> None:
    """Serve ``/docs``, its assets and the gateway's static files (the app must be made with docs_url=None)."""
    app.mount("/docs/assets", StaticFiles(directory=ASSETS), name="docs-assets")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(DOCS_PAGE, headers=HEADERS)
