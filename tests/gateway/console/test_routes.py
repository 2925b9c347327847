"""The console's login, session and logout routes through the gateway app (in process, embedded bus)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.gateway.console.test_sessions import OTHER, TOKEN, write_tokens
from vmsched.config import Settings
from vmsched.bus.inprocess import InProcessTransport
from vmsched.gateway.app import create_app
from vmsched.gateway.console.sessions import COOKIE, LOGIN_COOKIE
from vmsched.tokens import TokenStore

PAGE = "/console/decisions/" + "0" * 32  # a console page that needs no service: "Decision not found" (404)


@dataclass
class Gateways:
    """Gateway apps on one tokens file: two replicas with the same console secret, one with another, one without."""

    tokens: Path
    apps: dict[str, Any]

    def client(self, name: str = "a") -> TestClient:
        return TestClient(self.apps[name], follow_redirects=False)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Gateways:
    tmp = tmp_path_factory.mktemp("console-routes")
    tokens = tmp / "tokens.yaml"
    write_tokens(tokens, ("ops", TOKEN, "read, operate"), ("ci", OTHER, "schedule"))
    (tmp / "secret").write_text("a-console-secret-shared-by-the-replicas\n")
    (tmp / "another").write_text("the-console-secret-of-another-deployment\n")
    apps = {}
    for name, secret in (("a", "secret"), ("b", "secret"), ("other", "another"), ("random", None)):
        settings = Settings(amqp_url="memory://", tokens_file=tokens, console_secret_file=secret and tmp / secret)
        apps[name] = create_app(settings, InProcessTransport(), tokens=TokenStore(tokens, check_interval=0))
    return Gateways(tokens, apps)


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def log_in(client: TestClient, token: str = TOKEN) -> str:
    """Log in as a browser does; the session cookie's value."""
    form = client.get("/login")
    r = client.post("/login", data={"token": token, "csrf": csrf(form.text)})
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    return client.cookies[COOKIE]


def replay(client: TestClient, value: str) -> int:
    """The status of a console page fetched with this session cookie alone (a copy kept after logout)."""
    client.cookies.clear()
    client.cookies.set(COOKIE, value)
    return client.get(PAGE).status_code


def test_the_login_form_carries_a_csrf_token_bound_to_its_cookie(gateways: Gateways) -> None:
    client = gateways.client()
    form = client.get("/login")
    set_cookie = form.headers["set-cookie"]
    assert form.status_code == 200 and LOGIN_COOKIE in set_cookie
    assert all(flag in set_cookie.lower() for flag in ("httponly", "samesite=strict", "path=/login"))
    fresh = gateways.client("b")  # a forged cross-site post: no login cookie at all
    r = fresh.post("/login", data={"token": TOKEN, "csrf": csrf(form.text)})
    assert r.status_code == 403 and "log in again" in r.text and COOKIE not in r.headers.get("set-cookie", "")
    other = gateways.client()  # a form shown to another browser: its cookie is not ours
    r = client.post("/login", data={"token": TOKEN, "csrf": csrf(other.get("/login").text)})
    assert r.status_code == 403 and COOKIE not in client.cookies
    r = client.post("/login", data={"token": TOKEN})  # no CSRF token (each answer is a new form, a new token)
    assert r.status_code == 403
    r = client.post("/login", data={"token": "wrong", "csrf": csrf(r.text)})
    assert r.status_code == 401 and "unknown or revoked token" in r.text
    r = client.post("/login", data={"token": OTHER, "csrf": csrf(r.text)})
    assert r.status_code == 403 and "lacks the read role" in r.text
    assert client.post("/login", data={"token": TOKEN, "csrf": csrf(r.text)}).status_code == 303


def test_the_session_cookie_is_not_the_token_and_reaches_console_pages_only(gateways: Gateways) -> None:
    client = gateways.client()
    value = log_in(client)
    assert TOKEN not in value
    page = client.get(PAGE)
    assert page.status_code == 404 and "Decision not found" in page.text and 'action="/logout"' in page.text
    assert client.get("/v1/decisions").status_code == 401 and client.get("/v1/units").status_code == 401
    assert replay(client, TOKEN) == 303, "the raw token in the cookie is no session"


def test_a_session_works_on_every_replica_with_the_same_secret(gateways: Gateways) -> None:
    value = log_in(gateways.client("a"))
    assert replay(gateways.client("b"), value) == 404
    assert replay(gateways.client("other"), value) == 303


def test_logging_out_revokes_the_session_not_only_the_cookie(gateways: Gateways) -> None:
    client = gateways.client()
    value = log_in(client)
    second = log_in(gateways.client())  # the same token in another browser
    logout_csrf = csrf(client.get(PAGE).text)
    r = client.post("/logout")  # no CSRF token: refused, the session stays
    assert r.status_code == 403 and replay(client, value) == 404
    client.cookies.set(COOKIE, value)
    r = client.post("/logout", data={"csrf": logout_csrf})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert COOKIE in r.headers["set-cookie"] and "max-age=0" in r.headers["set-cookie"].lower()
    assert replay(client, value) == 303, "a copy of the cookie kept after logout is refused"
    assert replay(client, second) == 404, "the other browser's session stays"


def test_revoking_the_token_ends_its_console_sessions(gateways: Gateways) -> None:
    client = gateways.client()
    value = log_in(client)
    try:
        write_tokens(gateways.tokens, ("ci", OTHER, "schedule"))
        assert client.get(PAGE).status_code == 303
    finally:
        write_tokens(gateways.tokens, ("ops", TOKEN, "read, operate"), ("ci", OTHER, "schedule"))
    assert replay(client, value) == 404


def test_without_a_secret_file_sessions_are_this_processes(gateways: Gateways) -> None:
    value = log_in(gateways.client("random"))
    assert replay(gateways.client("random"), value) == 404 and replay(gateways.client("a"), value) == 303
