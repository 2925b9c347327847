"""The engine link's HTTP side: read-only calls to the oVirt engine's REST API (v4, JSON).

Resources used, as the API model (ovirt-engine-api-model) names them:

- ``POST /ovirt-engine/sso/oauth/token`` (form ``grant_type=password``,
  ``scope=ovirt-app-api``, ``username``, ``password``) -> ``{"access_token": ...}``,
  as the Python SDK v4 logs in; a refused login answers ``error`` with
  ``error_description`` (or ``error_code`` with ``error``). With ``auth: basic``
  in the link file, HTTP basic authentication instead.
- ``GET /ovirt-engine/api/hosts?search=hw_id=<id>`` -> ``{"host": [...]}``:
  the search field ``hw_id`` is the host's ``vds_unique_id``, what vdsm
  registered with (``/etc/vdsm/vdsm.id``, else the machine's hardware UUID).
- ``GET /ovirt-engine/api/hosts/<id>`` -> a host with ``hardware_information.uuid``.
- ``GET /ovirt-engine/api/vms/<id>`` -> a VM with ``memory`` (bytes),
  ``cpu.topology`` (``sockets``, ``cores``, ``threads``) and ``cpu_pinning_policy``.

The engine's JSON writes numbers as strings; both are read. Every call has a
bounded timeout; nothing here retries except one new login on a 401.
The password is never logged and never part of an error message.
"""

from __future__ import annotations

import re
import ssl
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import yaml

from vmsched.plugin.facts import pinning_needs

#: An engine ID as the engine writes them (a GUID); anything else never goes into a URL.
ENGINE_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,127}$")
MIB = 1 << 20


class EngineError(Exception):
    """A failed engine call; ``kind`` is a metric label: auth, not_found, timeout, error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class LinkConfig:
    url: str  # the API's base URL, e.g. https://engine.example.com/ovirt-engine/api
    username: str
    password: str = field(repr=False)  # never in the repr
    auth: str = "oauth"  # oauth (the SSO token, as the SDK) or basic


def load_config(path: Path) -> LinkConfig:
    """The link file: a YAML mapping of ``url``, ``username``, ``password`` and optional ``auth``."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError:
        raise ValueError(f"{path}: the engine link file is not YAML (url:, username:, password:)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with url, username and password")
    missing = [k for k in ("url", "username", "password") if not isinstance(data.get(k), str) or not data[k]]
    if missing:
        raise ValueError(f"{path}: the engine link file lacks {', '.join(missing)}")
    unknown = sorted(set(data) - {"url", "username", "password", "auth"})
    if unknown:
        raise ValueError(f"{path}: unknown keys in the engine link file: {', '.join(map(str, unknown))}")
    url = data["url"].rstrip("/")
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"{path}: the engine URL must be https://HOST/ovirt-engine/api (the link sends a password)")
    if parts.username or parts.password:
        raise ValueError(f"{path}: put the credentials in username: and password:, not in the URL")
    auth = str(data.get("auth", "oauth"))
    if auth not in ("oauth", "basic"):
        raise ValueError(f"{path}: auth must be oauth or basic")
    return LinkConfig(url, data["username"], data["password"], auth)


def number(value: Any) -> int:
    """An integer the engine wrote as a number or as a string; 0 when absent or not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def vm_requirements(data: dict[str, Any]) -> dict[str, Any]:
    """What vmsched.plugin.facts.VM carries, from the engine's VM representation."""
    topology = (data.get("cpu") or {}).get("topology") or {}
    sockets, cores, threads = (max(1, number(topology.get(k))) for k in ("sockets", "cores", "threads"))
    pinning = str(data.get("cpu_pinning_policy") or "none")
    vcpus = sockets * cores * threads
    return {"id": str(data.get("id", "")), "memory_mib": number(data.get("memory")) // MIB,
            "vcpus": vcpus, "sockets": sockets, "cores": cores, "threads": threads,
            "cpu_pinning_policy": pinning, **pinning_needs(pinning, vcpus), "source": "engine"}


class EngineClient:
    """A synchronous, read-only client; one per link, used by its one background thread."""

    def __init__(self, config: LinkConfig, ca: Path | None = None, timeout: float = 5.0) -> None:
        self.config = config
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca else True
        auth = httpx.BasicAuth(config.username, config.password) if config.auth == "basic" else None
        self._http = httpx.Client(verify=verify, timeout=httpx.Timeout(timeout), auth=auth, follow_redirects=False,
                                  headers={"Accept": "application/json", "Version": "4",
                                           "User-Agent": "vmsched-engine-link"})
        parts = urlsplit(config.url)
        self._token_url = f"{parts.scheme}://{parts.netloc}/ovirt-engine/sso/oauth/token"
        self._logout_url = f"{parts.scheme}://{parts.netloc}/ovirt-engine/services/sso-logout"
        self._token: str | None = None

    def close(self) -> None:
        """End the SSO session, as the SDK's close() does (best effort, bounded), and the connections."""
        token, self._token = self._token, None
        if token is not None:
            with suppress(httpx.HTTPError):
                self._http.post(self._logout_url, data={"scope": "ovirt-app-api", "token": token},
                                timeout=min(self._http.timeout.read or 2.0, 2.0))
        self._http.close()

    # --- the resources ----------------------------------------------------------------
    def hosts_by_hw_id(self, hw_id: str) -> list[dict[str, Any]]:
        """The engine's hosts whose ``hw_id`` (vds_unique_id) is ``hw_id`` (an :data:`ENGINE_ID`, as the link
        checks before it asks)."""
        data = self._get("/hosts", {"search": f"hw_id={hw_id}"})
        hosts = data.get("host") if isinstance(data, dict) else None
        return [h for h in hosts if isinstance(h, dict)] if isinstance(hosts, list) else []

    def host(self, host_id: str) -> dict[str, Any]:
        return self._get(f"/hosts/{self._id(host_id, 'host')}")

    def vm(self, vm_id: str) -> dict[str, Any]:
        return self._get(f"/vms/{self._id(vm_id, 'VM')}")

    # --- HTTP -------------------------------------------------------------------------
    @staticmethod
    def _id(value: str, what: str) -> str:
        if not ENGINE_ID.match(value):
            raise EngineError("not_found", f"{value[:80]!r} is not an engine {what} ID")
        return quote(value, safe="")

    def _get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        response = self._get_once(path, params)
        if response.status_code == 401 and self.config.auth == "oauth":
            self._token = None  # expired or revoked: one new login
            response = self._get_once(path, params)
        return self._json(response, path)

    def _get_once(self, path: str, params: dict[str, str] | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._login()}"} if self.config.auth == "oauth" else {}
        return self._send("GET", self.config.url + path, params=params, headers=headers)

    def _login(self) -> str:
        if self._token is None:
            form = {"grant_type": "password", "scope": "ovirt-app-api",
                    "username": self.config.username, "password": self.config.password}
            response = self._send("POST", self._token_url, data=form)
            try:
                body = response.json()
            except ValueError:
                body = None
            if not isinstance(body, dict) or not isinstance(body.get("access_token"), str):
                reason = _sso_error(body) or f"HTTP {response.status_code}"
                raise EngineError("auth", f"the engine refused the login of {self.config.username!r}: {reason}")
            self._token = body["access_token"]
        return self._token

    def _send(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            return self._http.request(method, url, **kw)
        except httpx.TimeoutException:
            raise EngineError("timeout", f"the engine did not answer {method} {urlsplit(url).path} in time") from None
        except httpx.HTTPError as exc:  # connection refused, TLS verification, ...
            raise EngineError("error", f"cannot reach the engine at {urlsplit(url).netloc}: "
                                       f"{type(exc).__name__}: {str(exc)[:300]}") from None

    @staticmethod
    def _json(response: httpx.Response, path: str) -> dict[str, Any]:
        if response.status_code == 404:
            raise EngineError("not_found", f"the engine has no {path}")
        if response.status_code in (401, 403):
            raise EngineError("auth", f"the engine refused GET {path}: HTTP {response.status_code} "
                                      "(check the link's user and its permissions)")
        if response.status_code != 200:
            detail = ""
            with suppress(ValueError):
                body = response.json()
                detail = f": {body.get('reason', '')} {body.get('detail', '')}".rstrip() if isinstance(body, dict) else ""
            raise EngineError("error", f"GET {path}: HTTP {response.status_code}{detail[:300]}")
        try:
            data = response.json()
        except ValueError:
            raise EngineError("error", f"GET {path}: the answer is not JSON") from None
        if not isinstance(data, dict):
            raise EngineError("error", f"GET {path}: the answer is not a JSON object")
        return data


def _sso_error(body: Any) -> str:
    """The SSO error text: ``error``/``error_description`` (OpenID) or ``error_code``/``error`` (OAuth)."""
    if not isinstance(body, dict):
        return ""
    if "error_description" in body:
        return f"{body.get('error', '')}: {body['error_description']}"[:300]
    if "error" in body:
        return f"{body.get('error_code', '')}: {body['error']}"[:300]
    return ""
