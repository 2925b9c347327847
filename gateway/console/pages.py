"""The operator console at ``GET /``: plain server-rendered HTML, read-only, offline.

Pages: ``/`` (recent decisions searchable by VM or host, units with load
errors, the agents' pools and policies (:mod:`console_agents`), host facts
and their age) and ``/console/decisions/{id}`` (every unit's
verdict on every host). ``/login`` takes a token and gives the browser a
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
import json
import logging
import time
from html import escape
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from vmsched.bus import BusError
from vmsched.gateway.console import agents as console_agents
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


def e(value: object) -> str:
    return escape(str(value), quote=True)


def page(title: str, body: str, status: int = 200, logout_token: str = "") -> HTMLResponse:
    """A console page; with ``logout_token`` (a session's), its header has the log-out button."""
    logout = ('<form method="post" action="/logout" class="logout">'
              f'<input type="hidden" name="csrf" value="{e(logout_token)}"><button type="submit">Log out</button></form>'
              if logout_token else "")
    html = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="/static/favicon.svg" type="image/svg+xml"><link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script>'
            f'</head><body><header><a href="/" class="brand">vmsched console</a>{logout}</header>'
            f'<main>{body}</main></body></html>')
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "no facts"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _when(at: float) -> str:
    return f'<time data-epoch="{at:.3f}">{e(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)))}</time>'


# --- login ---------------------------------------------------------------------------------------
def _sessions(request: Request) -> Sessions:
    return request.app.state.console_sessions


def _logout_token(request: Request) -> str:
    """The log-out form's CSRF token of the request's console session ("" without one: a bearer header)."""
    session = request.scope.get("vmsched.session")
    return _sessions(request).logout_token(session) if isinstance(session, Session) else ""


def _login_form(request: Request, error: str = "", status: int = 200) -> HTMLResponse:
    """The login form with a fresh CSRF token, and its cookie."""
    nonce, csrf = _sessions(request).login_form()
    problem = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    response = page("vmsched console - log in", (
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
            return page("vmsched console - not logged out", "<h1>Not logged out</h1><p class=\"error\">The log-out "
                        'form did not come from this console. Use the <a href="/">console</a>\'s Log out button.</p>',
                        403)
        sessions.logout(session)
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
        f'<td>{_when(d["time"])}</td><td>{e(d["op"])}</td><td>{e(d["vm"])}</td>'
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
        f'<tr class="{"problem" if v["stale"] else ""}"><td>{e(v["host_id"])}</td><td>{e(_age(v["age"]))}'
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
    return page("vmsched console", await _decisions_section(request) + units + agents + _facts_section(request),
                logout_token=_logout_token(request))


# --- one decision --------------------------------------------------------------------------------
def _cell(op: str, unit: dict[str, Any], host: str) -> str:
    reason = (unit.get("reasons") or {}).get(host)
    why = f'<div class="reason">{e(reason)}</div>' if reason else ""
    if not unit["ok"]:
        return '<td class="failed">ignored</td>'
    if op == "filter":
        if host in unit.get("dropped", []):
            return f'<td class="dropped">dropped{why}</td>'
        return f'<td class="kept">kept{why}</td>'
    if op == "score":
        score = unit.get("scores", {}).get(host)
        return f"<td>{e(score) if score is not None else 'no score'}{why}</td>"
    return f'<td>{"proposed" if host in unit.get("hosts", []) else ""}{why}</td>'


@router.get("/console/decisions/{decision_id}")
async def decision_page(request: Request, decision_id: str) -> HTMLResponse:
    found = await request.app.state.decisions.find(decision_id) if len(decision_id) == 32 else None
    if found is None or not found.records:
        note = _replicas_note(found.missing) if found is not None else ""
        return page("decision not found", f"<h1>Decision not found</h1><p>It may have left the ring.</p>{note}", 404,
                    _logout_token(request))
    d = found.records[0]
    units = d["units"]
    head = "".join(f'<th>{e(u["unit"])}' + (f' <span class="factor">x{e(u["factor"])}</span>' if "factor" in u else "")
                   + "</th>" for u in units)
    result = d["result"]
    chosen = set(result) if d["op"] == "filter" and isinstance(result, list) else set()
    rows = "".join(
        f'<tr><td>{e(h)}</td>{"".join(_cell(d["op"], u, h) for u in units)}'
        f'<td>{"kept" if h in chosen else ""}</td><td>{e(_age(d["facts_age"].get(h)))}</td></tr>'
        for h in d["hosts"])
    unit_rows = "".join(
        f'<tr class="{"" if u["ok"] else "problem"}"><td>{e(u["unit"])}</td><td>{"ok" if u["ok"] else "failed"}'
        f'{" (timed out)" if u["timed_out"] else ""}</td><td>{u["duration"] * 1000:.1f} ms</td>'
        f'<td><pre>{e(u["error"] or "")}</pre></td><td class="reason">{e(u.get("reason") or "")}</td></tr>'
        for u in units)
    errors = "".join(f"<li>{e(x)}</li>" for x in d["errors"])
    body = (f'<h1>{e(d["op"])} decision</h1><p class="summary" id="summary">{e(d["summary"])}</p>'
            f'<dl><dt>time</dt><dd>{_when(d["time"])}</dd><dt>VM</dt><dd>{e(d["vm"]) or "-"}</dd>'
            f'<dt>gateway</dt><dd>{e(d["gateway"])}</dd><dt>fallback</dt><dd>{"yes" if d["fallback"] else "no"}</dd>'
            f'<dt>duration</dt><dd>{d["duration"] * 1000:.1f} ms</dd>'
            f'<dt>sent to the engine</dt><dd><pre id="sent">{e(_envelope(d))}</pre></dd></dl>'
            + (f'<h2>Errors</h2><ul>{errors}</ul>' if errors else "") + _missing_facts(d)
            + f'<h2>Per unit, per host</h2><table id="verdicts"><thead><tr><th>host</th>{head}<th>result</th>'
              f'<th>facts age</th></tr></thead><tbody>{rows}</tbody></table>'
              f'<h2>Units</h2><table id="units-detail"><thead><tr><th>unit</th><th>outcome</th><th>duration</th>'
              f'<th>error</th><th>reason</th></tr></thead><tbody>{unit_rows}</tbody></table>'
              f'<p class="note">JSON: <code>/v1/decisions/{e(d["id"])}</code></p>')
    return page(f"vmsched decision {decision_id}", body, logout_token=_logout_token(request))


def _missing_facts(record: dict[str, Any]) -> str:
    """What the units that read host facts lacked: which hosts had no facts and why, and the VM's."""
    missing = record.get("missing_facts")
    if not missing:
        return ""
    causes = missing.get("hosts") or {}
    count = sum(len(hosts) for hosts in causes.values())
    items = "".join(f"<li>{len(hosts)} host{'s' if len(hosts) != 1 else ''}: {e(cause)} "
                    f"<span class=\"hosts\">({e(', '.join(hosts))})</span></li>" for cause, hosts in causes.items())
    if missing.get("vm"):
        items += f"<li>the VM: {e(missing['vm'])}</li>"
    return (f'<h2>Missing host facts</h2><div id="missing-facts"><p>{e(", ".join(missing.get("units", [])))} read '
            f'host facts; {count} of {len(record["hosts"])} hosts had none.</p><ul>{items}</ul></div>')


def _envelope(record: dict[str, Any]) -> str:
    """The engine's reply envelope of a decision as JSON (docs/plugins.md: what result_code 0 and 1 mean)."""
    sent = {k: record.get(k) for k in ("result_code", "result", "plugin_errors", "errors")}
    return json.dumps(sent, indent=2, ensure_ascii=False)
