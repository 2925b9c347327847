"""The operator console at ``GET /``: plain server-rendered HTML, read-only, offline.

Pages: ``/`` (recent decisions searchable by VM or host, units with load
errors, the agents' pools and policies (:mod:`console_agents`), host facts
and their age), ``/console/decisions/{id}`` (every unit's
verdict on every host: :mod:`decision`) and ``/console/whatif`` (shadow
comparisons and replay reports: :mod:`whatif`). ``/login`` takes a token and gives the browser a
session of the console's own (:mod:`vmsched.gateway.console.sessions`), in an
HttpOnly, SameSite=Strict cookie that authorises these GET pages only
(:mod:`vmsched.gateway.auth`); the login and logout forms carry CSRF tokens.
Everything that comes from plugins, agents or
the engine is escaped; pages carry a strict Content-Security-Policy (scripts
and styles from ``/static/`` only, no inline script). The engine only POSTs
to ``/``, so GET is free.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from vmsched.bus import BusError
from vmsched.gateway.console import agents as console_agents
from vmsched.gateway.console import decision, whatif
from vmsched.gateway.console.markup import age, e, when
from vmsched.gateway.console.sessions import COOKIE as CONSOLE_COOKIE
from vmsched.gateway.console.sessions import LOGIN_COOKIE, LOGIN_TTL, Session, Sessions, cookie
from vmsched.tokens import MAX_TOKEN
from vmsched.tokens import Role

log = logging.getLogger("vmsched.gateway.console")
router = APIRouter(include_in_schema=False)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-store"}
MAX_FORM = 8192
SHOWN_DECISIONS = 50


def page(request: Request, title: str, body: str, status: int = 200) -> HTMLResponse:
    """A console page; for a request with a console session (not a bearer header), its header has the log-out
    button, whose form carries the session's CSRF token."""
    session = request.scope.get("vmsched.session")
    logout_token = _sessions(request).logout_token(session) if isinstance(session, Session) else ""
    logout = ('<form method="post" action="/logout" class="logout">'
              f'<input type="hidden" name="csrf" value="{e(logout_token)}"><button type="submit">Log out</button></form>'
              if logout_token else "")
    html = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="/static/favicon.svg" type="image/svg+xml"><link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script>'
            f'</head><body><header><a href="/" class="brand">vmsched console</a>'
            '<nav><a href="/">Decisions</a><a href="/console/whatif">What if</a></nav>'
            f'{logout}</header>'
            f'<main>{body}</main></body></html>')
    return HTMLResponse(html, status_code=status, headers=HEADERS)


# --- login ---------------------------------------------------------------------------------------
def _sessions(request: Request) -> Sessions:
    return request.app.state.console_sessions


def _login_form(request: Request, error: str = "", status: int = 200) -> HTMLResponse:
    """The login form with a fresh CSRF token, and its cookie."""
    nonce, csrf = _sessions(request).login_form()
    problem = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    response = page(request, "vmsched console - log in", (
        f"<h1>Log in</h1>{problem}<form method=\"post\" action=\"/login\" class=\"login\">"
        f'<input type="hidden" name="csrf" value="{e(csrf)}">'
        '<label for="token">API token (read role)</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" required>'
        '<button type="submit">Log in</button></form>'
        "<p>Make a token with <code>vmsched token new --name NAME --role read --file tokens.yaml</code>. "
        "The console keeps a read-only session of its own, never the token.</p>"),
        status)
    response.set_cookie(LOGIN_COOKIE, nonce, max_age=LOGIN_TTL, httponly=True, samesite="strict", path="/login",
                        secure=request.url.scheme == "https")
    return response


async def _form(request: Request) -> dict[str, str] | None:
    """The form's fields (the first value of each), or None when it is too large."""
    body = await request.body()
    if len(body) > MAX_FORM:
        return None
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}


@router.get("/login")
async def login_form(request: Request) -> HTMLResponse:
    return _login_form(request)


@router.post("/login")
async def login(request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _login_form(request, "the form is too large", 413)
    sessions = _sessions(request)
    if not sessions.login_allowed(cookie(request.scope, LOGIN_COOKIE), form.get("csrf", "")):
        return _login_form(request, "the login form expired or did not come from this console: log in again", 403)
    token = form.get("token", "").strip()
    store = request.app.state.tokens
    identity = store.by_token(token) if store.configured and 0 < len(token) <= MAX_TOKEN else None
    if identity is None:
        why = "this gateway has no tokens file" if not store.configured else "unknown or revoked token"
        return _login_form(request, why, 401)
    if Role.READ not in identity.roles:
        request.scope["vmsched.identity"] = identity  # the refusal's audit line names it
        return _login_form(request, f"token {identity.name!r} lacks the read role", 403)
    issued = sessions.issue(identity)
    if issued is None:  # the token left the tokens file just now
        return _login_form(request, "unknown or revoked token", 401)
    response = RedirectResponse("/", status_code=303, headers={"Cache-Control": "no-store"})
    response.set_cookie(CONSOLE_COOKIE, issued[0], max_age=int(sessions.ttl), httponly=True, samesite="strict",
                        path="/", secure=request.url.scheme == "https")
    response.delete_cookie(LOGIN_COOKIE, path="/login", httponly=True, samesite="strict")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the console session everywhere (this replica's list and, on RabbitMQ, the others'), then the cookie."""
    sessions = _sessions(request)
    session = sessions.signed(cookie(request.scope, CONSOLE_COOKIE))
    if session is not None:
        form = await _form(request)
        if form is None or not sessions.logout_allowed(session, form.get("csrf", "")):
            return page(request, "vmsched console - not logged out", "<h1>Not logged out</h1><p class=\"error\">"
                        'The log-out form did not come from this console. Use the <a href="/">console</a>\'s Log out '
                        "button.</p>", 403)
        sessions.logouts.add(session.sid, session.expires)  # on this replica; shared below
        link = request.app.state.console_logouts
        if link is not None and not await asyncio.to_thread(link.share, [(session.sid, session.expires)]):
            log.warning("console logout of a session of %r not shared with the other gateway replicas now: the bus "
                        "is unavailable (it is shared when this gateway subscribes again)", session.name)
    response = RedirectResponse("/login", status_code=303, headers={"Cache-Control": "no-store"})
    response.delete_cookie(CONSOLE_COOKIE, path="/", httponly=True, samesite="strict")
    return response


# --- the overview --------------------------------------------------------------------------------
async def _units_section(request: Request) -> str:
    try:
        reply = await request.app.state.scheduler.discover()
    except BusError as exc:
        return f'<section id="units"><h2>Units</h2><p class="error">cannot list units: {e(exc)}</p></section>'
    rows = "".join(
        f"<tr><td>{e(u.name)}</td><td>{e(u.kind.value)}</td><td>{e(u.description)}</td>"
        f"<td><code>{e(u.validation)}</code>"
        + (f'<div class="error">{e(u.validation_error)}</div>' if u.validation_error else "")
        + f"</td><td>{e(u.plugin)}</td></tr>" for u in sorted(reply.units, key=lambda u: (u.kind.value, u.name)))
    errors = "".join(f'<li><strong>{e(x.plugin)}</strong>: <pre>{e(x.error)}</pre></li>' for x in reply.load_errors)
    return (f'<section id="units"><h2>Units ({len(reply.units)})</h2>'
            '<input type="search" class="filter" data-table="units-table" placeholder="filter units">'
            '<table id="units-table"><thead><tr><th>name</th><th>kind</th><th>description</th><th>validation</th>'
            f'<th>plugin</th></tr></thead><tbody>{rows}</tbody></table>'
            + (f'<h3>Plugin load errors ({len(reply.load_errors)})</h3><ul id="load-errors">{errors}</ul>'
               if reply.load_errors else '<p id="load-errors">No plugin load errors.</p>')
            + "</section>")


async def _decisions_section(request: Request) -> str:
    q = request.query_params
    vm, host, op = q.get("vm", "")[:256], q.get("host", "")[:256], q.get("op", "")
    errors_only = q.get("errors") == "only"
    log = request.app.state.decisions
    result = await log.search(SHOWN_DECISIONS, vm=vm or None, host=host or None,
                              op=op if op in ("filter", "score", "balance") else None, errors_only=errors_only)
    found = result.records
    options = "".join(f'<option value="{o}"{" selected" if o == op else ""}>{o or "any"}</option>'
                      for o in ("", "filter", "score", "balance"))
    form = ('<form method="get" action="/" class="search">'
            f'<label>VM <input name="vm" value="{e(vm)}"></label>'
            f'<label>host <input name="host" value="{e(host)}"></label>'
            f'<label>operation <select name="op">{options}</select></label>'
            f'<label><input type="checkbox" name="errors" value="only"{" checked" if errors_only else ""}> '
            'errors only</label><button type="submit">Search</button></form>')
    rows = "".join(
        f'<tr class="{"problem" if d["fallback"] or d["result_code"] else ""}">'
        f'<td>{when(d["time"])}</td><td>{e(d["op"])}</td><td>{e(d["vm"])}</td>'
        f'<td><a href="/console/decisions/{e(d["id"])}">{e(d["summary"])}</a></td>'
        f'<td>{"yes" if d["fallback"] else ""}</td><td>{e(d["gateway"])}</td></tr>' for d in found)
    table = ('<table id="decisions-table"><thead><tr><th>time</th><th>op</th><th>VM</th><th>summary</th>'
             f'<th>fallback</th><th>gateway</th></tr></thead><tbody>{rows}</tbody></table>' if found
             else '<p>No decision matches.</p>')
    return (f'<section id="decisions"><h2>Recent decisions</h2>{form}{_replicas_note(result.missing)}{table}'
            f'<p class="note">Newest {SHOWN_DECISIONS} at most; each gateway keeps {log.ring.size} per operation. '
            f'JSON: <code>/v1/decisions{e(_query(q))}</code></p></section>')


def _replicas_note(missing: list[dict[str, str]]) -> str:
    """The gateway replicas that did not answer in time: their decisions are not in the list."""
    if not missing:
        return ""
    items = "".join(f"<li>{e(m['gateway'])}: {e(m['error'])}</li>" for m in missing)
    return f'<div class="error" id="replicas-missing">Not every gateway replica answered:<ul>{items}</ul></div>'


def _query(params: Any) -> str:
    given = urlencode({k: v for k, v in params.items() if v})
    return f"?{given}" if given else ""


def _facts_section(request: Request) -> str:
    cache = request.app.state.facts
    if cache is None:
        return '<section id="facts"><h2>Host facts</h2><p>This gateway keeps no facts cache (--facts is off).</p></section>'
    views = cache.views()
    if not views:
        return '<section id="facts"><h2>Host facts</h2><p>No agent has sent host facts yet.</p></section>'
    rows = "".join(
        f'<tr class="{"problem" if v["stale"] else ""}"><td>{e(v["host_id"])}</td><td>{e(age(v["age"]))}'
        f'{" (stale)" if v["stale"] else ""}</td><td>{e(v["source"])}</td>'
        f'<td><details><summary>{len(v["guests"])} guests</summary><pre>{e(_facts_text(v["host"]))}</pre>'
        f'</details></td></tr>' for v in views)
    return ('<section id="facts"><h2>Host facts</h2><table id="facts-table"><thead><tr><th>host</th><th>age</th>'
            f'<th>source</th><th>facts</th></tr></thead><tbody>{rows}</tbody></table></section>')


def _facts_text(host: dict[str, Any]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in host.items() if not isinstance(v, (list, dict)))


@router.get("/")
async def overview(request: Request) -> HTMLResponse:
    units = await _units_section(request)
    cache = request.app.state.facts
    agents = await console_agents.section(request.app.state.bus, cache.hosts() if cache is not None else [])
    decisions = await _decisions_section(request)
    return page(request, "vmsched console", decisions + units + agents + _facts_section(request))


# --- one decision --------------------------------------------------------------------------------
@router.get("/console/decisions/{decision_id}")
async def decision_page(request: Request, decision_id: str) -> HTMLResponse:
    found = await request.app.state.decisions.find(decision_id) if len(decision_id) == 32 else None
    if found is None or not found.records:
        note = _replicas_note(found.missing) if found is not None else ""
        return page(request, "decision not found", "<h1>Decision not found</h1><p>It may have left the ring.</p>"
                    + note, 404)
    store = getattr(request.app.state, "shadow", None)  # an app of the console alone has none
    shadow = whatif.shadow_section(store.get(decision_id) if store is not None else None)
    return page(request, f"vmsched decision {decision_id}", decision.body(found.records[0], shadow))


# --- what if: shadow comparisons and replay reports -----------------------------------------------------
@router.get("/console/whatif")
async def whatif_page(request: Request) -> HTMLResponse:
    q = request.query_params
    body = await asyncio.to_thread(whatif.page, request.app.state.shadow, request.app.state.whatif_reports,
                                   q.get("status", ""), q.get("op", ""))
    return page(request, "vmsched what if", body)


@router.get("/console/whatif/reports/{name}")
async def report_page(request: Request, name: str) -> HTMLResponse:
    folder = request.app.state.whatif_reports
    back = '<p><a href="/console/whatif">Back to the what-if view</a></p>'
    if folder is None:
        return page(request, "no reports folder", "<h1>No reports folder</h1><p>Start the gateway with "
                    f"<code>--whatif-reports DIR</code>.</p>{back}", 404)
    try:
        report = await asyncio.to_thread(whatif.read_report, folder, name)
    except whatif.ReportError as exc:
        return page(request, "report not shown", f'<h1>Report not shown</h1><p class="error" id="report-error">'
                    f"{e(exc)}</p>{back}", 404)
    return page(request, f"vmsched replay report {name}", whatif.report_page(name, report))
