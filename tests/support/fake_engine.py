"""A small fake of the oVirt engine's REST resources the engine link reads (no engine can run here).

Written from the API model (ovirt-engine-api-model) and the engine's behaviour:

- ``POST /ovirt-engine/sso/oauth/token``: the SSO password grant
  (``grant_type=password``, ``scope=ovirt-app-api``) -> ``{"access_token", "token_type", "exp"}``; bad
  credentials -> 400 ``{"error_code": "access_denied", "error": "Cannot authenticate user ..."}``.
- ``GET /ovirt-engine/api/hosts?search=hw_id=X``: hosts whose ``vds_unique_id`` is X (the search
  backend's ``hw_id`` column, compared case-insensitively) -> ``{"host": [...]}``, or ``{}``.
- ``GET /ovirt-engine/api/hosts/ID``, ``GET /ovirt-engine/api/vms/ID``: one entity, or 404
  ``{"reason": "Operation Failed", "detail": "Entity not found: ..."}``.
- ``POST /ovirt-engine/services/sso-logout`` (``scope``, ``token``): the token ends.

Numbers are written as strings, as the engine's JSON does. The API needs a bearer token (or HTTP
basic credentials), else 401. ``delay`` makes every answer slow; ``calls`` counts requests by path.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.tls_certs import CertSet

API = "/ovirt-engine/api"
GIB = 1 << 30


@dataclass
class FakeEngine:
    certs: CertSet
    username: str = "vmsched@internal"
    password: str = "s3cret-engine-password"
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {"vds_unique_id", "hardware_uuid", "name"}
    vms: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {"name", "memory", "sockets", ...}
    delay: float = 0.0
    calls: Counter = field(default_factory=Counter)
    tokens: set[str] = field(default_factory=set)
    logins: int = 0
    _server: ThreadingHTTPServer | None = None

    # --- the data, in engine terms --------------------------------------------------------
    def add_host(self, host_id: str, vds_unique_id: str, hardware_uuid: str = "", name: str = "") -> None:
        self.hosts[host_id] = {"vds_unique_id": vds_unique_id, "hardware_uuid": hardware_uuid, "name": name or host_id}

    def add_vm(self, vm_id: str, memory_mib: int, sockets: int = 1, cores: int = 1, threads: int = 1,
               pinning: str = "none", name: str = "") -> None:
        self.vms[vm_id] = {"name": name or vm_id, "memory": memory_mib << 20, "sockets": sockets, "cores": cores,
                           "threads": threads, "pinning": pinning}

    def expire_tokens(self) -> None:
        self.tokens.clear()

    # --- the server ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}{API}"

    def link_file(self, folder: Path, password: str | None = None, auth: str = "oauth") -> Path:
        path = folder / "engine-link.yaml"
        path.write_text(f"url: {self.url}\nusername: {self.username}\n"
                        f"password: {json.dumps(self.password if password is None else password)}\nauth: {auth}\n")
        path.chmod(0o600)
        return path

    def start(self) -> "FakeEngine":
        engine = self

        class Handler(_Handler):
            fake = engine

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certs.server_cert, self.certs.server_key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, name="fake-engine", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeEngine
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _wait(self) -> None:
        if self.fake.delay:
            time.sleep(self.fake.delay)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        path = urlsplit(self.path).path
        self.fake.calls[path] += 1
        length = int(self.headers.get("Content-Length") or 0)
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
        self._wait()
        if path == "/ovirt-engine/services/sso-logout":  # the SDK's close(): the token ends
            self.fake.tokens.discard(form.get("token", ""))
            return self._reply(200, {})
        if path != "/ovirt-engine/sso/oauth/token":
            return self._reply(404, {"reason": "Not Found"})
        if form.get("grant_type") != "password" or form.get("scope") != "ovirt-app-api":
            return self._reply(400, {"error_code": "invalid_request", "error": "unsupported grant or scope"})
        if form.get("username") != self.fake.username or form.get("password") != self.fake.password:
            return self._reply(400, {"error_code": "access_denied", "error": f"Cannot authenticate user "
                                     f"'{form.get('username')}': The username or password is incorrect.."})
        token = secrets.token_urlsafe(24)
        self.fake.tokens.add(token)
        self.fake.logins += 1
        self._reply(200, {"access_token": token, "scope": "ovirt-app-api", "token_type": "bearer",
                          "exp": str(int(time.time() * 1000) + 3600_000)})

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return header[7:] in self.fake.tokens
        if header.startswith("Basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            return user == self.fake.username and password == self.fake.password
        return False

    def do_GET(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        self.fake.calls[parts.path] += 1
        self._wait()
        if not self._authorized():
            return self._reply(401, {"reason": "Unauthorized"})
        if not parts.path.startswith(API + "/"):
            return self._reply(404, {"reason": "Not Found"})
        kind, _, ident = parts.path[len(API) + 1:].partition("/")
        ident = unquote(ident)
        if kind == "hosts" and not ident:
            search = parse_qs(parts.query).get("search", [""])[0]
            field_, _, value = search.partition("=")
            if field_.strip().lower() != "hw_id" or not value.strip():
                return self._reply(400, {"reason": "Operation Failed", "detail": f"unsupported search {search!r}"})
            found = [_host(i, h) for i, h in self.fake.hosts.items()
                     if h["vds_unique_id"].lower() == value.strip().lower()]
            return self._reply(200, {"host": found} if found else {})
        if kind == "hosts" and ident in self.fake.hosts:
            return self._reply(200, _host(ident, self.fake.hosts[ident]))
        if kind == "vms" and ident in self.fake.vms:
            return self._reply(200, _vm(ident, self.fake.vms[ident]))
        self._reply(404, {"reason": "Operation Failed", "detail": f"Entity not found: {ident}"})


def _host(host_id: str, h: dict[str, Any]) -> dict[str, Any]:
    return {"id": host_id, "href": f"{API}/hosts/{host_id}", "name": h["name"], "status": "up",
            "hardware_information": {"uuid": h["hardware_uuid"], "manufacturer": "QEMU", "product_name": "Standard PC"}}


def _vm(vm_id: str, v: dict[str, Any]) -> dict[str, Any]:
    return {"id": vm_id, "href": f"{API}/vms/{vm_id}", "name": v["name"], "status": "down",
            "memory": str(v["memory"]), "cpu_pinning_policy": v["pinning"],
            "cpu": {"architecture": "x86_64", "topology": {"sockets": str(v["sockets"]), "cores": str(v["cores"]),
                                                           "threads": str(v["threads"])}},
            "memory_policy": {"guaranteed": str(v["memory"]), "max": str(v["memory"] * 4), "ballooning": "true"}}
