"""``/docs``: Swagger UI from package assets (``swagger-ui-bundle``), so it works without internet access.

The page loads the bundle from ``/docs/assets/`` and starts it with a static
script from ``/static/`` (no inline script: a strict Content-Security-Policy).
Both prefixes are open (:data:`vmsched.gateway.auth.OPEN_PREFIXES`): they hold
no data. ReDoc has no packaged copy here, so ``/redoc`` is off.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

STATIC = Path(__file__).resolve().parent / "static"
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
DOCS_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>vmsched gateway - API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="/docs/assets/favicon-32x32.png">
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
    app.mount("/docs/assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(DOCS_PAGE, headers={"Content-Security-Policy": DOCS_CSP, "X-Content-Type-Options": "nosniff",
                                                "Cache-Control": "no-store"})
