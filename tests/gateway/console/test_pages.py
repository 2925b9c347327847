"""The operator console (GET /) and the offline /docs, over HTTP on a real all-in-one process.

The browser test (tests/e2e/test_console_browser.py) checks what a browser loads;
these check login, the cookie's narrow reach, escaping, the CSP and content.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support.stack import TEST_TOKEN, Stack, start_all_in_one
from tests.support.waiting import wait_until

H = [f"bbbbbbbb-0000-0000-0000-00000000000{i}" for i in range(5)]
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_all_in_one(tmp_path_factory.mktemp("console"), "memory://")
    (stack.plugins / "hostile_text.py").write_text(
        "class HostileText:\n"
        f"    properties_validation = {HOSTILE!r}\n\n"
        "    def do_filter(self, hosts, vm, args):\n"
        f"        {HOSTILE!r}\n"
        "        return hosts\n")
    wait_until(lambda: "HostileText" in {u["name"] for u in stack.get("/v1/units").json()["units"]}, 30, 0.2,
               "the hostile plugin loaded")
    yield stack
    stack.stop()


def _client(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=stack.url, timeout=30, follow_redirects=False)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


@contextmanager
def _logged_in(stack: Stack) -> Iterator[httpx.Client]:
    with _client(stack) as client:
        r = client.post("/login", data={"token": TEST_TOKEN, "csrf": _csrf(client.get("/login").text)})
        assert r.status_code == 303 and r.headers["location"] == "/"
        yield client


def test_pages_need_a_login_and_the_cookie_is_strict(console: Stack) -> None:
    with _client(console) as client:
        r = client.get("/")
        assert r.status_code == 303 and r.headers["location"] == "/login"
        form = client.get("/login")
        assert form.status_code == 200 and 'name="token"' in form.text
        assert "script-src 'self'" in form.headers["content-security-policy"]
        assert client.post("/login", data={"token": TEST_TOKEN}).status_code == 403  # no CSRF token
        wrong = client.post("/login", data={"token": "wrong", "csrf": _csrf(client.get("/login").text)})
        assert wrong.status_code == 401
        r = client.post("/login", data={"token": TEST_TOKEN, "csrf": _csrf(wrong.text)})
        cookie = r.headers["set-cookie"].lower()
        assert r.status_code == 303 and "httponly" in cookie and "samesite=strict" in cookie
        assert TEST_TOKEN.lower() not in cookie, "the browser keeps a session, never the token"
        page = client.get("/")
        assert page.status_code == 200
        r = client.post("/logout", data={"csrf": _csrf(page.text)})
        assert r.status_code == 303 and client.get("/").status_code == 303


def test_the_console_cookie_authorises_no_api_call(console: Stack) -> None:
    with _logged_in(console) as client:
        assert client.get("/").status_code == 200
        assert client.get("/v1/decisions").status_code == 401
        assert client.get("/v1/units").status_code == 401
        assert client.post("/v1/filter", json={"units": ["KeepEven"], "hosts": H}).status_code == 401
        assert client.put("/v1/hosts/hv1/cpus", json={"dedicated_pool": "2-3"}).status_code == 401
        assert client.post("/", content=b"").headers["content-type"].startswith("text/xml")  # the engine's path
    # a bearer token works on the pages too (curl, scripts)
    assert console.get("/", follow_redirects=False).status_code == 200


def test_units_load_errors_and_escaping(console: Stack) -> None:
    with _logged_in(console) as client:
        r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "'unsafe-inline'" not in csp and "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "KeepEven" in r.text and "Keep hosts at even positions of the input." in r.text
    assert "broken_import" in r.text and "module_that_does_not_exist" in r.text
    assert HOSTILE not in r.text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in r.text
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", r.text, re.S)
    assert scripts and all(body == "" for body in scripts)  # no inline script: only src=/static/...
    assert not re.search(r"(src|href)=\"(https?:)?//", r.text)  # nothing from elsewhere


def test_a_decision_appears_with_per_unit_per_host_detail(console: Stack) -> None:
    vm = str(uuid.uuid4())
    assert console.xmlrpc("runFilters", ["KeepEven", "KeepAllButLast"], H, vm, {})["result"] == [H[0], H[2]]
    with _logged_in(console) as client:
        def listed() -> str | None:
            page = client.get("/", params={"vm": vm}).text
            found = re.search(r'href="/console/decisions/([0-9a-f]{32})"', page)
            return found.group(1) if found else None

        decision = wait_until(listed, 10, 0.1, "the decision on the console")
        assert client.get("/", params={"host": "not-a-host"}).text.count("/console/decisions/") == 0
        detail = client.get(f"/console/decisions/{decision}")
        assert detail.status_code == 200
        assert "kept 2 of 5 hosts: KeepEven dropped 2" in detail.text
        rows = {m.group(1): m.group(2) for m in re.finditer(r"<tr><td>([0-9a-f-]{36})</td>(.*?)</tr>", detail.text)}
        assert set(rows) == set(H)
        assert rows[H[1]].count('class="dropped"') == 1 and rows[H[4]].count('class="dropped"') == 1
        assert 'class="dropped"' not in rows[H[0]]
        assert client.get("/console/decisions/" + "0" * 32).status_code == 404


def test_the_decision_page_shows_the_engines_envelope_as_json(console: Stack) -> None:
    vm = str(uuid.uuid4())
    sent = console.xmlrpc("runFilters", ["KeepEven", "Raises"], H, vm, {})
    assert sent["result_code"] == 1 and list(sent["plugin_errors"]) == ["Raises"]
    with _logged_in(console) as client:
        def listed() -> str | None:
            found = re.search(r'href="/console/decisions/([0-9a-f]{32})"', client.get("/", params={"vm": vm}).text)
            return found.group(1) if found else None

        detail = client.get(f"/console/decisions/{wait_until(listed, 10, 0.1, 'the decision on the console')}")
    shown = re.search(r'<pre id="sent">(.*?)</pre>', detail.text, re.S)
    assert shown, detail.text
    assert json.loads(html.unescape(shown.group(1))) == sent  # exactly what the engine was sent


def test_docs_are_served_from_package_assets(console: Stack) -> None:
    r = httpx.get(console.url + "/docs", timeout=30)
    assert r.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in r.text
    assert "cdn" not in r.text.lower() and "<script>" not in r.text
    for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css", "/static/docs-init.js",
                  "/static/console.js", "/static/console.css"):
        got = httpx.get(console.url + asset, timeout=30)
        assert got.status_code == 200 and len(got.content) > 100, asset
    for escape in ("/static/../auth.py", "/static/%2e%2e/auth.py", "/static/..%2fauth.py"):
        got = httpx.get(console.url + escape, timeout=30)
        assert got.status_code in (401, 404) and "import" not in got.text, escape  # no source outside static/


def test_static_files_ship_in_the_package() -> None:
    from vmsched.gateway import docs_ui

    assert {p.name for p in Path(docs_ui.STATIC).iterdir()} >= {"console.js", "console.css", "docs-init.js"}
