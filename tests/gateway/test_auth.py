"""Who may call what: the JSON API's roles against every route, over real sockets and TLS.

Two real processes share one tokens file:

* ``tls_run``: ``vmsched run`` (embedded bus) over HTTPS with client certificates accepted,
  ``--engine-allow`` a network the tests are not in, and its metrics listener on HTTPS with
  ``--metrics-auth``. The scheduling routes answer 200 here.
* ``down_gateway``: ``vmsched gateway`` whose broker is a closed port, so every ``/v1/hosts``
  route answers 503 at once after authorisation (no agent needed to test who may call it).
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from cryptography import x509
from fastapi import FastAPI

from tests.support.net import free_port
from tests.support.stack import Proc
from tests.support.waiting import wait_until
from tests.support.engine_wire import call
from tests.support.tls_certs import CertSet, make_certs
from vmsched.gateway import agent_api, api, facts_api
from vmsched.gateway.decisions import api as decisions_api
from vmsched.gateway.auth import OPEN_PATHS, ROUTE_ROLES, check_routes
from vmsched.tokens import Role, digest

TOKENS = {"reader": ["read"], "scheduler": ["schedule"], "operator": ["operate"]}
SECRET = {name: f"secret-{name}-0123456789" for name in TOKENS}
#: concrete request for every declared route: (path, JSON body)
EXAMPLES: dict[tuple[str, str], tuple[str, Any]] = {
    ("GET", "/v1/units"): ("/v1/units", None),
    ("POST", "/v1/filter"): ("/v1/filter", {"units": ["HostAllowDeny"], "hosts": ["h1", "h2"]}),
    ("POST", "/v1/score"): ("/v1/score", {"units": [{"name": "PreferredHosts"}], "hosts": ["h1"]}),
    ("POST", "/v1/balance"): ("/v1/balance", {"unit": "DrainHosts", "hosts": ["h1", "h2"]}),
    ("GET", "/v1/hosts/{host}/policies"): ("/v1/hosts/hv1/policies", None),
    ("GET", "/v1/hosts/{host}/policies/{guest}"): ("/v1/hosts/hv1/policies/db", None),
    ("GET", "/v1/hosts/{host}/policies/{guest}/explain"): ("/v1/hosts/hv1/policies/db/explain", None),
    ("GET", "/v1/hosts/{host}/cpus"): ("/v1/hosts/hv1/cpus", None),
    ("PUT", "/v1/hosts/{host}/policies/{guest}"): ("/v1/hosts/hv1/policies/db", {"dedicated": 2}),
    ("DELETE", "/v1/hosts/{host}/policies/{guest}"): ("/v1/hosts/hv1/policies/db", None),
    ("PUT", "/v1/hosts/{host}/cpus"): ("/v1/hosts/hv1/cpus", {"dedicated_pool": "2-3"}),
    ("POST", "/v1/hosts/{host}/reconcile"): ("/v1/hosts/hv1/reconcile", None),
    ("POST", "/v1/hosts/{host}/domains/{guest}/start"): ("/v1/hosts/hv1/domains/db/start", {"wait": 0}),
    ("POST", "/v1/hosts/{host}/domains/{guest}/stop"): ("/v1/hosts/hv1/domains/db/stop", {"wait": 0, "force": True}),
    ("GET", "/v1/facts"): ("/v1/facts", None),
    ("GET", "/v1/hosts/{host}/facts"): ("/v1/hosts/hv1/facts", None),
    ("GET", "/v1/decisions"): ("/v1/decisions?op=filter", None),
    ("GET", "/v1/decisions/{decision_id}"): ("/v1/decisions/" + "0" * 32, None),
    ("GET", "/v1/shadow"): ("/v1/shadow?status=changed", None),
    ("GET", "/v1/shadow/{comparison_id}"): ("/v1/shadow/" + "0" * 32, None),
}


def client_subject(certs: CertSet) -> str:
    return x509.load_pem_x509_certificate(certs.client_cert.read_bytes()).subject.rfc4514_string()


def write_tokens(path: Path, tokens: dict[str, list[str]], secrets: dict[str, str], clients: str = "") -> None:
    lines = ["tokens:"]
    for name, roles in tokens.items():
        lines += [f"  - name: {name}", f"    roles: [{', '.join(roles)}]", f"    sha256: {digest(secrets[name])}"]
    path.write_text("\n".join(lines) + "\n" + clients)


class Server:
    def __init__(self, proc: Proc, url: str, verify: Any = True, metrics: str | None = None) -> None:
        self.proc, self.url, self.verify, self.metrics = proc, url, verify, metrics

    def request(self, method: str, path: str, token: str | None = None, body: Any = None, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        with httpx.Client(verify=self.verify, timeout=30, **kw) as c:
            return c.request(method, self.url + path, json=body, headers=headers)

    def wait(self) -> None:
        def up() -> bool:
            assert self.proc.popen and self.proc.popen.poll() is None, self.proc.output()[-3000:]
            try:
                return self.request("GET", "/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, 0.1, f"{self.url} to answer")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory, certs: CertSet) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.yaml"
    write_tokens(path, TOKENS, SECRET, f'clients:\n  - subject: "{client_subject(certs)}"\n    roles: [read]\n')
    return path


@pytest.fixture(scope="module")
def tls_run(tmp_path_factory: pytest.TempPathFactory, certs: CertSet, tokens_file: Path) -> Iterator[Server]:
    port, metrics_port = free_port(), free_port()
    proc = Proc(["run", "--port", str(port), "--pool-size", "1", "--tokens-file", str(tokens_file),
                 "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                 "--tls-client-ca", str(certs.ca), "--engine-allow", "10.0.0.0/8, 192.168.0.0/16",
                 "--metrics-port", str(metrics_port), "--metrics-auth",
                 "--metrics-tls-cert", str(certs.server_cert), "--metrics-tls-key", str(certs.server_key)],
                tmp_path_factory.mktemp("tls-run") / "run.log").start()
    server = Server(proc, f"https://127.0.0.1:{port}", str(certs.ca), f"https://127.0.0.1:{metrics_port}")
    try:
        server.wait()
        yield server
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def down_gateway(tmp_path_factory: pytest.TempPathFactory, tokens_file: Path) -> Iterator[Server]:
    port, metrics_port = free_port(), free_port()
    proc = Proc(["gateway", "--amqp", f"amqp://127.0.0.1:{free_port()}//", "--port", str(port), "--connect-timeout",
                 "0.5", "--tokens-file", str(tokens_file), "--metrics-port", str(metrics_port), "--log-format", "json"],
                tmp_path_factory.mktemp("down-gateway") / "gateway.log").start()
    server = Server(proc, f"http://127.0.0.1:{port}", metrics=f"http://127.0.0.1:{metrics_port}")
    try:
        server.wait()
        yield server
    finally:
        proc.kill()


# --- every route declares its role --------------------------------------------------------------
def _app(*extra_routes: str) -> FastAPI:
    app = FastAPI()
    app.include_router(api.router)
    app.include_router(agent_api.router)
    app.include_router(facts_api.router)
    app.include_router(decisions_api.router)
    for path in extra_routes:
        app.add_api_route(path, lambda: {"open": True}, methods=["GET"])
    return app


def test_every_route_has_a_declared_role() -> None:
    check_routes(_app())  # the routers as they are: each route declared
    assert set(EXAMPLES) == set(ROUTE_ROLES), "the matrix below covers every declared route"


def test_a_new_route_without_a_role_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"GET /v1/hosts/\{host\}/sensors"):
        check_routes(_app("/v1/hosts/{host}/sensors"))


# --- the authorisation matrix -------------------------------------------------------------------
CREDENTIALS = ["none", "unknown", *TOKENS]


def _expected_ok(route: tuple[str, str]) -> int:
    """The status once authorised: 200 for scheduling on the all-in-one, 503 for agents behind a down bus."""
    if route[1] == "/v1/hosts/{host}/facts":
        return 404  # authorised, but no agent has sent facts for hv1
    if route[1] in ("/v1/decisions/{decision_id}", "/v1/shadow/{comparison_id}"):
        return 404  # authorised, but no such decision or comparison
    return 503 if route[1].startswith("/v1/hosts/") else 200


@pytest.mark.parametrize("route", list(EXAMPLES), ids=lambda r: f"{r[0]} {r[1]}")
@pytest.mark.parametrize("who", CREDENTIALS)
def test_authorisation_matrix(route: tuple[str, str], who: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("down_gateway" if route[1].startswith("/v1/hosts/") else "tls_run")
    path, body = EXAMPLES[route]
    token = {"none": None, "unknown": "not-a-token"}.get(who, SECRET.get(who))
    r = server.request(route[0], path, token, body)
    role = ROUTE_ROLES[route]
    if who in ("none", "unknown"):
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["detail"]
    elif role.value not in TOKENS[who]:
        assert r.status_code == 403, r.text
        assert role.value in r.json()["detail"] and who in r.json()["detail"]
    else:
        assert r.status_code == _expected_ok(route), r.text


def test_open_endpoints_need_no_credential(tls_run: Server) -> None:
    for path in ("/healthz", "/readyz", "/docs", "/openapi.json"):
        assert tls_run.request("GET", path).status_code == 200, path
    metrics = tls_run.request("GET", "/metrics")  # not here: where it is, said to anyone
    assert metrics.status_code == 404 and metrics.json()["metrics"] == tls_run.metrics + "/metrics"
    # anything else, even a path that does not exist, needs a credential first
    assert tls_run.request("GET", "/v1/nothing").status_code == 401
    assert tls_run.request("GET", "/v1/nothing", SECRET["reader"]).status_code == 404


def test_no_cookie_ever_authorises(tls_run: Server) -> None:
    for cookie in (f"token={SECRET['operator']}", f"Authorization=Bearer {SECRET['reader']}",
                   f"session={SECRET['reader']}"):
        r = tls_run.request("GET", "/v1/units", headers={"Cookie": cookie})
        assert r.status_code == 401, cookie
    r = tls_run.request("GET", "/v1/units", headers={"Authorization": f"Basic {SECRET['reader']}"})
    assert r.status_code == 401 and "Bearer" in r.json()["detail"]


def test_openapi_shows_the_bearer_scheme_on_every_protected_route(tls_run: Server) -> None:
    spec = tls_run.request("GET", "/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {**spec["components"]["securitySchemes"]["bearer"],
                                                               "type": "http", "scheme": "bearer"}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            role = ROUTE_ROLES.get((method.upper(), path))
            if path in OPEN_PATHS:
                assert "security" not in op, (method, path)
                continue
            assert role is not None, f"{method} {path} has no role"
            assert op["security"] == [{"bearer": []}], (method, path)
            assert op["x-vmsched-role"] == role.value and {"401", "403"} <= set(op["responses"])


# --- client certificates -------------------------------------------------------------------------
def test_client_certificate_maps_to_its_roles(tls_run: Server, certs: CertSet) -> None:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    ctx.load_cert_chain(certs.client_cert, certs.client_key)
    tls_run_cert = Server(tls_run.proc, tls_run.url, ctx)
    assert tls_run_cert.request("GET", "/v1/units").status_code == 200
    path, body = EXAMPLES[("POST", "/v1/filter")]
    r = tls_run_cert.request("POST", path, None, body)
    assert r.status_code == 403 and client_subject(certs) in r.json()["detail"]
    # a client certificate from a CA the gateway does not trust: no TLS session at all
    other = ssl.create_default_context(cafile=str(certs.ca))
    rogue = make_certs(certs.ca.parent / "rogue")
    other.load_cert_chain(rogue.client_cert, rogue.client_key)
    with pytest.raises(httpx.HTTPError):
        Server(tls_run.proc, tls_run.url, other).request("GET", "/v1/units")


def test_plain_http_on_the_tls_port_gets_nothing(tls_run: Server) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(tls_run.url.replace("https://", "http://") + "/v1/units", timeout=5)


# --- audit ---------------------------------------------------------------------------------------
def _audit_lines(server: Server) -> list[dict[str, Any]]:
    out = []
    for line in server.proc.output().splitlines():
        if line.startswith("{") and '"vmsched.audit"' in line:
            out.append(json.loads(line))
    return out


def test_operate_calls_and_refusals_are_audited(down_gateway: Server) -> None:
    down_gateway.request("POST", "/v1/hosts/hv9/domains/web%201/stop", SECRET["operator"], {"wait": 0, "force": True})
    down_gateway.request("PUT", "/v1/hosts/hv9/cpus", SECRET["reader"], {"dedicated_pool": "1"})
    down_gateway.request("DELETE", "/v1/hosts/hv9/policies/web", None)
    down_gateway.request("GET", "/v1/hosts/hv9/cpus", SECRET["reader"])  # an allowed read: counted, no line

    def lines() -> list[dict[str, Any]]:
        return [a for a in _audit_lines(down_gateway) if a["host"] == "hv9"]

    found = wait_until(lambda: len(lines()) >= 3 and lines(), 10, 0.1, "three audit lines")
    stop, pool, delete = found[:3]
    assert stop | {"ts": 0} == {
        "ts": 0, "event": "vmsched.audit", "who": "operator", "via": "token", "role": "operate", "method": "POST",
        "route": "/v1/hosts/{host}/domains/{guest}/stop", "operation": "stop_domain", "host": "hv9",
        "guest": "web 1", "status": 503, "outcome": "error", "client": "127.0.0.1"}
    assert (pool["who"], pool["status"], pool["outcome"], pool["operation"]) == ("reader", 403, "forbidden", "set_pool")
    assert (delete["who"], delete["status"], delete["via"], delete["guest"]) == (None, 401, "none", "web")
    assert not any(a["role"] == "read" and a["status"] == 503 for a in lines())
    log = down_gateway.proc.output()
    assert not any(secret in log for secret in SECRET.values()), "a token value reached the log"
    text = httpx.get(down_gateway.metrics + "/metrics", timeout=10).text
    assert 'vmsched_gateway_audit_total{outcome="error",role="operate"}' in text
    assert 'vmsched_gateway_audit_total{outcome="forbidden",role="operate"}' in text


# --- the engine's XML-RPC ------------------------------------------------------------------------
def test_engine_allow_refuses_other_clients_with_a_fault(tls_run: Server) -> None:
    for path in ("/", "/RPC2"):
        r = httpx.post(tls_run.url + path, content=call("discover"), verify=tls_run.verify, timeout=10,
                       headers={"Content-Type": "text/xml"})
        assert r.status_code == 200 and b"<fault>" in r.content
        assert b"not allowed" in r.content and b"--engine-allow" in r.content
    # the limit is on the engine's two paths only: the JSON API still answers a token
    assert tls_run.request("GET", "/v1/units", SECRET["reader"]).status_code == 200


def test_engine_allow_admits_listed_networks() -> None:
    """In-process, with the peer address set: listed IPv4, IPv4-mapped IPv6 and IPv6 networks pass."""
    from vmsched.gateway.app import allowed
    from vmsched.config import Settings

    nets = Settings(engine_allow="10.0.0.0/8,fd00::/8,192.168.1.7").engine_networks
    assert allowed(("10.2.3.4", 1), nets) and allowed(("::ffff:10.2.3.4", 1), nets) and allowed(("fd00::1", 1), nets)
    assert allowed(("192.168.1.7", 1), nets) and not allowed(("192.168.1.8", 1), nets)
    assert not allowed(("127.0.0.1", 1), nets) and not allowed(None, nets) and allowed(("127.0.0.1", 1), [])


def test_engine_paths_stay_open_without_allow_list(down_gateway: Server) -> None:
    r = httpx.post(down_gateway.url + "/", content=call("discover"), timeout=30, headers={"Content-Type": "text/xml"})
    assert r.status_code == 200 and b"not allowed" not in r.content


# --- the metrics listener ------------------------------------------------------------------------
def test_metrics_listener_tls_and_auth(tls_run: Server) -> None:
    def get(token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(tls_run.metrics + "/metrics", verify=tls_run.verify, headers=headers, timeout=10)

    assert get(None).status_code == 401 and get(None).headers["www-authenticate"] == "Bearer"
    assert get("not-a-token").status_code == 401
    assert get(SECRET["scheduler"]).status_code == 401  # no read role
    r = get(SECRET["reader"])
    assert r.status_code == 200 and "vmsched_gateway_audit_total" in r.text
    # probes stay open; plain http gets nothing from the TLS listener
    assert httpx.get(tls_run.metrics + "/healthz", verify=tls_run.verify, timeout=10).status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(tls_run.metrics.replace("https://", "http://") + "/metrics", timeout=5)


def test_roles_are_the_documented_three() -> None:
    assert {r.value for r in Role} == {"read", "schedule", "operate"}
    assert {ROUTE_ROLES[("POST", p)] for p in ("/v1/filter", "/v1/score", "/v1/balance")} == {Role.SCHEDULE}
