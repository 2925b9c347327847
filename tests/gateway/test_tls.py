"""Rotation without restarts: tokens and the TLS certificate, on a real gateway; tokens CLI; listener defaults.

The gateway's broker is a closed port, so an authorised ``/v1/hosts`` call answers 503 at
once: 503 means "the credential was accepted", 401 "it was not".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.stack import Proc
from tests.support.waiting import wait_until
from tests.support.tls_certs import make_certs
from vmsched import metrics
from vmsched.config import Settings
from vmsched.tokens import digest, parse


def tokens_yaml(**tokens: str) -> str:
    return "tokens:\n" + "".join(f"  - name: {name}\n    roles: [read]\n    sha256: {digest(secret)}\n"
                                 for name, secret in tokens.items())


def swap_secret(mount: Path, version: str, text: str) -> None:
    """Like a Kubernetes Secret volume: tokens.yaml -> ..data/tokens.yaml, ..data swapped atomically."""
    (mount / version).mkdir()
    (mount / version / "tokens.yaml").write_text(text)
    tmp = mount / "..data_tmp"
    tmp.symlink_to(version)
    os.replace(tmp, mount / "..data")
    if not (mount / "tokens.yaml").is_symlink():
        (mount / "tokens.yaml").symlink_to("..data/tokens.yaml")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Proc, str, str, Path, Path]]:
    """A TLS gateway on its own certificate files and a Secret-like tokens mount."""
    certs = make_certs(tmp_path / "certs")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(certs.server_cert, cert)
    shutil.copy(certs.server_key, key)
    mount = tmp_path / "secret"
    mount.mkdir()
    swap_secret(mount, "v1", tokens_yaml(alice="token-alice"))
    port, metrics_port = free_port(), free_port()
    proc = Proc(["gateway", "--amqp", f"amqp://127.0.0.1:{free_port()}//", "--port", str(port),
                 "--connect-timeout", "0.5", "--tokens-file", str(mount / "tokens.yaml"),
                 "--tls-cert", str(cert), "--tls-key", str(key), "--metrics-port", str(metrics_port)],
                tmp_path / "gateway.log").start()
    url = f"https://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.popen and proc.popen.poll() is None, proc.output()[-3000:]
        try:
            return httpx.get(url + "/healthz", verify=str(certs.ca), timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 60, 0.1, "the TLS gateway")
        yield proc, url, f"http://127.0.0.1:{metrics_port}", mount, certs.ca
    finally:
        proc.kill()


def _status(url: str, ca: Path, token: str) -> int:
    r = httpx.get(url + "/v1/hosts/hv1/cpus", verify=str(ca), timeout=10, headers={"Authorization": f"Bearer {token}"})
    return r.status_code


def test_tokens_rotate_without_restart(gateway: tuple[Proc, str, str, Path, Path]) -> None:
    proc, url, metrics_url, mount, ca = gateway
    assert _status(url, ca, "token-alice") == 503 and _status(url, ca, "token-bob") == 401
    # the Secret is updated: bob replaces alice, no restart
    swap_secret(mount, "v2", tokens_yaml(bob="token-bob"))
    wait_until(lambda: _status(url, ca, "token-bob") == 503, 10, 0.1, "the new token to work")
    assert _status(url, ca, "token-alice") == 401
    # edited in place (a plain file under the link): carol added
    (mount / "v2" / "tokens.yaml").write_text(tokens_yaml(bob="token-bob", carol="token-carol"))
    wait_until(lambda: _status(url, ca, "token-carol") == 503, 10, 0.1, "the added token to work")
    # a broken file, then none at all: the last good set stays, the error is logged and counted
    (mount / "v2" / "tokens.yaml").write_text("tokens: [this is: not valid\n")
    wait_until(lambda: "tokens file not reloaded" in proc.output(), 10, 0.1, "the reload error in the log")
    assert _status(url, ca, "token-bob") == 503 and _status(url, ca, "token-carol") == 503
    (mount / "v2" / "tokens.yaml").unlink()
    wait_until(lambda: proc.output().count("tokens file not reloaded") >= 2, 10, 0.1, "the missing file logged")
    assert _status(url, ca, "token-bob") == 503
    text = httpx.get(metrics_url + "/metrics", timeout=10).text
    assert 'vmsched_auth_tokens_reloads_total{outcome="error"} 2.0' in text
    assert 'vmsched_auth_tokens_reloads_total{outcome="ok"} 2.0' in text
    assert "token-" not in proc.output(), "a token value reached the log"


def test_certificate_reloads_without_restart(gateway: tuple[Proc, str, str, Path, Path], tmp_path: Path) -> None:
    proc, url, _, _, old_ca = gateway
    renewed = make_certs(tmp_path / "renewed")  # a new CA and server certificate
    assert httpx.get(url + "/healthz", verify=str(old_ca), timeout=5).status_code == 200
    # the key is written first: for a moment key and certificate do not match, which must not break anything
    shutil.copy(renewed.server_key, tmp_path / "tls.key")
    assert httpx.get(url + "/healthz", verify=str(old_ca), timeout=5).status_code == 200
    shutil.copy(renewed.server_cert, tmp_path / "tls.crt")

    def renewed_served() -> bool:
        try:
            return httpx.get(url + "/healthz", verify=str(renewed.ca), timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(renewed_served, 15, 0.2, "the renewed certificate to be served")
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/healthz", verify=str(old_ca), timeout=5)
    assert "TLS certificate" in proc.output() and "reloaded" in proc.output()


# --- the token command -----------------------------------------------------------------------------
def _vmsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_token_new_prints_the_token_once_and_stores_its_digest(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    first = _vmsched("token", "new", "--name", "ovirt-ops", "--role", "read", "--role", "operate", "--file", str(path))
    second = _vmsched("token", "new", "--name", "ci", "--role", "schedule", "--file", str(path))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    tokens = [first.stdout.strip(), second.stdout.strip()]
    assert all(len(t) > 40 for t in tokens) and tokens[0] != tokens[1]
    text = path.read_text()
    doc = parse(text)
    assert [(t.name, [r.value for r in t.roles], t.sha256) for t in doc.tokens] == [
        ("ovirt-ops", ["read", "operate"], digest(tokens[0])), ("ci", ["schedule"], digest(tokens[1]))]
    assert not any(t in text for t in tokens) and path.stat().st_mode & 0o077 == 0
    again = _vmsched("token", "new", "--name", "ci", "--role", "read", "--file", str(path))
    assert again.returncode == 2 and "already has a token named 'ci'" in again.stderr and not again.stdout
    bare = _vmsched("token", "new", "--name", "x", "--role", "read")
    assert bare.returncode == 0 and digest(bare.stdout.strip()) in bare.stderr


def test_gateway_refuses_to_start_on_a_bad_tokens_file(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.yaml"
    bad.write_text("tokens:\n  - name: x\n    roles: [admin]\n    sha256: abc\n")
    for path, reason in ((bad, "roles"), (tmp_path / "missing.yaml", "does not exist")):
        r = _vmsched("gateway", "--port", str(free_port()), "--metrics-port", str(free_port()), "--tokens-file", str(path))
        assert r.returncode == 2 and reason in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_without_tokens_file_every_json_route_says_how_to_make_one() -> None:
    import asyncio

    from vmsched.bus.inprocess import InProcessTransport
    from vmsched.gateway.app import create_app

    app = create_app(Settings(amqp_url="memory://"), InProcessTransport())

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.get("/v1/units", headers={"Authorization": "Bearer anything"})

    r = asyncio.run(get())
    assert r.status_code == 401 and "vmsched token new" in r.json()["detail"]


# --- listeners bind loopback unless told otherwise ----------------------------------------------------
def test_listeners_default_to_loopback() -> None:
    settings = Settings(_env_file=None)
    assert settings.host == "127.0.0.1" and settings.metrics_host == "127.0.0.1"
    server = metrics.serve(0)
    try:
        assert server is not None and server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
