"""Who may call which JSON route: bearer tokens or client certificates, mapped to roles.

Every route of the FastAPI app is either open (:data:`OPEN_PATHS`: probes and
the API docs, which hold no data) or has a role in :data:`ROUTE_ROLES`;
:func:`check_routes` refuses an app with a route in neither, so a new
endpoint cannot be added open by accident. :class:`Guard` runs before the
framework reads a body: no credential is a 401 (``WWW-Authenticate: Bearer``)
and a missing role a 403, each with a JSON reason. Credentials are the
``Authorization: Bearer`` header or a verified client certificate (the ASGI
TLS extension's ``client_cert_name``). A cookie is read in one place only:
the console's session cookie (:mod:`vmsched.gateway.console.sessions`), for a
GET of a console page (:data:`CONSOLE_PAGES`, read role); it never authorises
a /v1 call or any state-changing request.
"""

from __future__ import annotations

import json
import re

from fastapi import FastAPI
from starlette.routing import compile_path
from starlette.types import Message, Receive, Scope, Send

from vmsched.gateway import audit
from vmsched.gateway.console.sessions import COOKIE as CONSOLE_COOKIE
from vmsched.gateway.console.sessions import Sessions, cookie
from vmsched.gateway.strict_json import header, respond
from vmsched.tokens import MAX_TOKEN, Identity, Role, TokenStore

#: Routes anyone may call: they hold no data (``/metrics`` here only says where the metrics listener is).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json",
                        "/metrics"})
#: Path prefixes anyone may read: static assets of /docs and of the console, no data.
OPEN_PREFIXES = ("/docs/assets/", "/static/")
#: The console's pages (:mod:`vmsched.gateway.console.pages`): GET only, the read role, from the bearer header or
#: the console's session cookie. They are the only requests where a cookie counts; a cookie never authorises
#: anything else.
CONSOLE_PAGES = re.compile(r"^/(console/decisions/[0-9a-f]{32}|console/whatif|console/whatif/reports/[^/]{1,255})?$")
#: The console's login form and logout: open (the token is in the form, with a CSRF token; logout checks the
#: session and the form's CSRF token itself).
CONSOLE_OPEN = frozenset({("GET", "/login"), ("POST", "/login"), ("POST", "/logout")})

#: The role each JSON route needs, by (method, route path). Every route must be here or open.
ROUTE_ROLES: dict[tuple[str, str], Role] = {
    ("GET", "/v1/units"): Role.READ,
    ("POST", "/v1/filter"): Role.SCHEDULE,
    ("POST", "/v1/score"): Role.SCHEDULE,
    ("POST", "/v1/balance"): Role.SCHEDULE,
    ("GET", "/v1/hosts/{host}/policies"): Role.READ,
    ("GET", "/v1/hosts/{host}/policies/{guest}"): Role.READ,
    ("GET", "/v1/hosts/{host}/policies/{guest}/explain"): Role.READ,
    ("GET", "/v1/hosts/{host}/cpus"): Role.READ,
    ("GET", "/v1/facts"): Role.READ,
    ("GET", "/v1/hosts/{host}/facts"): Role.READ,
    ("GET", "/v1/decisions"): Role.READ,
    ("GET", "/v1/decisions/{decision_id}"): Role.READ,
    ("GET", "/v1/shadow"): Role.READ,
    ("GET", "/v1/shadow/{comparison_id}"): Role.READ,
    ("PUT", "/v1/hosts/{host}/policies/{guest}"): Role.OPERATE,
    ("DELETE", "/v1/hosts/{host}/policies/{guest}"): Role.OPERATE,
    ("PUT", "/v1/hosts/{host}/cpus"): Role.OPERATE,
    ("POST", "/v1/hosts/{host}/reconcile"): Role.OPERATE,
    ("POST", "/v1/hosts/{host}/domains/{guest}/start"): Role.OPERATE,
    ("POST", "/v1/hosts/{host}/domains/{guest}/stop"): Role.OPERATE,
}

NO_TOKENS_FILE = ("this gateway has no tokens file, so the JSON API accepts no credential: create a token with "
                  "`vmsched token new --name NAME --role read --file tokens.yaml` and start the gateway with "
                  "--tokens-file tokens.yaml (see docs/api-auth.md)")


def check_routes(app: FastAPI) -> dict[tuple[str, str], str]:
    """Every route ``app`` documents is open or has a declared role, and every declared role names a route; returns
    (method, path) -> the endpoint's name (e.g. ``set_policy``), from its OpenAPI operationId."""
    names = {}
    for path, ops in app.openapi()["paths"].items():
        for method, op in ops.items():
            suffix = re.sub(r"\W", "_", path) + "_" + method
            names[(method.upper(), path)] = str(op.get("operationId", "")).removesuffix(suffix)
    undeclared = sorted(f"{m} {p}" for m, p in names if p not in OPEN_PATHS and (m, p) not in ROUTE_ROLES)
    stale = sorted(f"{m} {p}" for m, p in ROUTE_ROLES if (m, p) not in names)
    if undeclared or stale:
        raise RuntimeError(f"gateway routes without a role in vmsched.gateway.auth.ROUTE_ROLES: {undeclared}; "
                           f"roles declared for routes that do not exist: {stale}")
    return names


_DECLARED = [(method, path, compile_path(path)[0], role) for (method, path), role in ROUTE_ROLES.items()]


def match(method: str, path: str) -> tuple[Role | None, str, dict[str, str], bool]:
    """(role, route, path params, path known) of a request: its declared route, if it has one (the app sees no
    other request: deny by default)."""
    method = "GET" if method == "HEAD" else method
    known = False
    for m, route, regex, role in _DECLARED:
        found = regex.match(path)
        if found:
            known = True
            if m == method:
                return role, route, found.groupdict(), True
    return None, path, {}, known


def add_security_scheme(app: FastAPI) -> None:
    """OpenAPI: the HTTP bearer scheme on every protected operation, with its role and 401/403; in the schema the
    app makes once and keeps (call this when every route is in)."""
    schema = app.openapi()
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
        "type": "http", "scheme": "bearer",
        "description": "a token from the gateway's tokens file (`vmsched token new`); a verified client "
                       "certificate whose subject the tokens file maps to roles is accepted too",
    }
    for (method, path), role in ROUTE_ROLES.items():
        op = schema["paths"][path][method.lower()]
        op["security"] = [{"bearer": []}]
        op["x-vmsched-role"] = role.value
        op["description"] = (op.get("description", "") + f"\n\nRequires the `{role.value}` role.").strip()
        op.setdefault("responses", {}).update({
            "401": {"description": "no valid credential (JSON reason; WWW-Authenticate: Bearer)"},
            "403": {"description": f"the credential lacks the {role.value} role (JSON reason)"},
        })


def identify(scope: Scope, store: TokenStore) -> tuple[Identity | None, str]:
    """The caller's identity, or None and the reason to give."""
    if not store.configured:
        return None, NO_TOKENS_FILE
    authorization = header(scope, b"authorization")
    if authorization is not None:
        scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None, "the Authorization header must be 'Bearer <token>'"
        identity = store.by_token(token) if len(token) <= MAX_TOKEN else None  # a longer one is no token
        return (identity, "") if identity else (None, "unknown or revoked token")
    subject = scope.get("extensions", {}).get("tls", {}).get("client_cert_name")
    if subject:
        identity = store.by_subject(subject)
        return (identity, "") if identity else (None, f"client certificate {subject!r} is not in the tokens file")
    return None, "a credential is required: send 'Authorization: Bearer <token>' (see docs/api-auth.md)"


async def _reply(send: Send, status: int, reason: str, extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    body = json.dumps({"detail": reason}).encode()
    await respond(send, status, body, [(b"content-type", b"application/json"), *extra])


class StatusOf:
    """An ASGI ``send`` that remembers the status the app answered with (``status`` until it answers)."""

    def __init__(self, send: Send, status: int) -> None:
        self.send = send
        self.status = status

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


class Guard:
    """Authenticate and authorise every non-open request before the app sees it; audit the result."""

    def __init__(self, app: FastAPI, store: TokenStore, sessions: Sessions) -> None:
        self.operations = check_routes(app)  # (method, path) -> the endpoint's name
        self.app = app
        self.store = store
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES):
            return await self.app(scope, receive, send)
        if (scope["method"], scope["path"]) in CONSOLE_OPEN:
            return await self._open(scope, receive, send)
        if scope["method"] in ("GET", "HEAD") and CONSOLE_PAGES.match(scope["path"]):
            return await self._console(scope, receive, send)
        role, route, params, known = match(scope["method"], scope["path"])
        operation = self.operations.get((scope["method"], route), "")
        identity, reason = identify(scope, self.store)
        client = (scope.get("client") or (None,))[0]

        def done(status: int) -> None:
            audit.record(role=role, identity=identity, method=scope["method"], route=route, operation=operation,
                         params=params, status=status, client=client)

        if identity is None:
            done(401)
            challenge = b'Bearer error="invalid_token"' if header(scope, b"authorization") else b"Bearer"
            return await _reply(send, 401, reason, [(b"www-authenticate", challenge)])
        if role is not None and role not in identity.roles:
            done(403)
            held = ", ".join(sorted(r.value for r in identity.roles))
            return await _reply(send, 403, f"{identity.kind} {identity.name!r} (roles: {held}) lacks the "
                                           f"{role.value!r} role that {scope['method']} {route} needs")
        if role is None:  # deny by default: only declared routes reach the app
            return await _reply(send, 405 if known else 404,
                                f"{scope['method']} is not allowed here" if known else "no such route")
        scope["vmsched.identity"] = identity
        answer = StatusOf(send, 500)
        try:
            await self.app(scope, receive, answer)
        finally:
            done(answer.status)

    async def _open(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An open console route (log in, log out): the app answers, and a 401 or 403 it gives is audited.

        Who was refused is named when the route puts the identity it found in ``scope["vmsched.identity"]``.
        """
        answer = StatusOf(send, 0)
        try:
            await self.app(scope, receive, answer)
        finally:
            if answer.status in (401, 403):  # the console's routes are not in the OpenAPI document: no operation ID
                audit.record(role=Role.READ, identity=scope.get("vmsched.identity"), method=scope["method"],
                             route=scope["path"], operation="console", params={}, status=answer.status,
                             client=(scope.get("client") or (None,))[0])

    async def _console(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A console page: the read role from the bearer header or a console session; else the login form."""
        identity, _ = identify(scope, self.store)
        if identity is None and self.sessions.tokens.configured:  # the session cookie, while it is valid
            found = self.sessions.read(cookie(scope, CONSOLE_COOKIE))
            if found is not None:
                identity, scope["vmsched.session"] = found
        status = 401 if identity is None else 200 if Role.READ in identity.roles else 403
        audit.record(role=Role.READ, identity=identity, method=scope["method"], route=scope["path"],
                     operation="console", params={}, status=status, client=(scope.get("client") or (None,))[0])
        if status != 200:
            return await respond(send, 303, b"", [(b"location", b"/login"), (b"cache-control", b"no-store")])
        scope["vmsched.identity"] = identity
        await self.app(scope, receive, send)
