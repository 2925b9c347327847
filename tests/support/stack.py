"""Real vmsched processes started by tests: one process (Proc), a gateway with its services (Stack)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
import xmlrpc.client
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.engine_wire import call
from tests.support.net import free_port
from tests.support.paths import ROOT, TEST_PLUGINS
from tests.support.waiting import wait_until
from vmsched.cli.runner import service_queues

#: The queues the services consume, as they declare them (``QUEUES``).
SERVICE_QUEUES = service_queues()
ALL_QUEUES = tuple(q for queues in SERVICE_QUEUES.values() for q in queues)
SCORING_QUEUES = SERVICE_QUEUES["discovery"] + SERVICE_QUEUES["scoring"]

#: The JSON API needs a bearer token: every process a test starts gets a tokens file holding
#: TEST_TOKEN with all roles, and the Stack helpers send it (docs/api-auth.md).
TEST_TOKEN = "vmsched-test-token-all-roles"
AUTH = {"Authorization": f"Bearer {TEST_TOKEN}"}
#: Environment of every Proc: the tokens file (set by conftest's session fixture), and an
#: ephemeral gateway metrics port (no clash on 9100).
TEST_ENV: dict[str, str] = {"VMSCHED_METRICS_PORT": "0"}

#: The two buses a test runs on, as fixture parameters: the ``rabbitmq`` case needs the broker.
BUSES = ["memory", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]


@dataclass
class Proc:
    """A vmsched process started by a test; its log is kept for failure reports."""

    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> "Proc":
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **TEST_ENV, **self.env}
        self.popen = subprocess.Popen([sys.executable, "-P", "-m", "vmsched.cli", *self.args], cwd=ROOT, env=env,
                                      stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Stack:
    """A running gateway (plus services) and an engine-style client for it."""

    def __init__(self, port: int, plugins: Path, procs: list[Proc], metrics_port: int | None = None) -> None:
        self.port = port
        self.plugins = plugins
        self.procs = procs
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}" if metrics_port else None

    def xmlrpc(self, method: str, *params: Any, path: str = "/") -> Any:
        """One call like the engine makes it: Apache-style body, a new connection."""
        r = httpx.post(self.url + path, content=call(method, *params),
                       headers={"Content-Type": "text/xml"}, timeout=60)
        r.raise_for_status()
        (value,), _ = xmlrpc.client.loads(r.content)
        return value

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **{"headers": AUTH, **kw})

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **{"headers": AUTH, **kw})

    def wait_ready(self, timeout: float = 60.0, queues: tuple[str, ...] = ALL_QUEUES) -> None:
        """Until /readyz says every queue in ``queues`` has a consumer answering."""

        def ready() -> bool:
            for p in self.procs:
                if p.popen and p.popen.poll() is not None:
                    raise AssertionError(f"process exited early ({p.popen.returncode}):\n{p.output()[-3000:]}")
            try:
                r = self.get("/readyz")
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and all(r.json()["queues"].get(q) == "ok" for q in queues)

        wait_until(ready, timeout, 0.1, "the stack to be ready")

    def stop(self) -> None:
        for p in self.procs:
            p.kill(signal.SIGTERM)


def plugin_copy(tmp_path: Path) -> Path:
    target = tmp_path / "plugins"
    shutil.copytree(TEST_PLUGINS, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def console_login(client: httpx.Client, token: str = TEST_TOKEN) -> httpx.Response:
    """Log in to the console as a browser does: the login form's CSRF token, then the token (303 when it works)."""
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
    assert found, "the login form has no CSRF token"
    return client.post("/login", data={"token": token, "csrf": found.group(1)})


def bus_args(folder: Path, url: str) -> list[str]:
    """Command-line options that put a process on ``url``: a password goes in a file, never on the command line."""
    if url.startswith("memory://"):
        return ["--amqp", url]
    path = folder / f"amqp-url-{uuid.uuid4().hex[:8]}"
    path.write_text(url + "\n")
    path.chmod(0o600)
    return ["--amqp-url-file", str(path)]


def start_replicas(folder: Path, url: str, tokens: Path, names: tuple[str, ...] = ("gw-1", "gw-2")) -> tuple[list[Proc], list[str]]:
    """`vmsched gateway` replicas on the bus at ``url``, with one tokens file and one console secret (made here):
    their processes and base URLs, each answering /healthz."""
    secret = folder / "console.secret"
    assert Proc(["console-secret", "--file", str(secret)], folder / "secret.log").start().popen.wait(30) == 0  # type: ignore[union-attr]
    bus = bus_args(folder, url)
    procs: list[Proc] = []
    urls: list[str] = []
    try:
        for name in names:
            port = free_port()
            procs.append(Proc(["gateway", *bus, "--port", str(port), "--tokens-file", str(tokens),
                               "--console-secret-file", str(secret)], folder / f"{name}.log",
                              env={"VMSCHED_AMQP_URL": "", "VMSCHED_GATEWAY_ID": name}).start())
            urls.append(f"http://127.0.0.1:{port}")
        for base in urls:
            wait_until(lambda: _healthy(base), 30, 0.1, f"{base} to answer")
    except BaseException:
        for proc in procs:
            proc.kill(signal.SIGTERM)
        raise
    return procs, urls


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start_all_in_one(tmp_path: Path, bus: str, *extra: str, plugins: Path | None = None) -> Stack:
    plugins = plugins or plugin_copy(tmp_path)
    port, metrics_port = free_port(), free_port()
    proc = Proc(["run", *bus_args(tmp_path, bus), "--plugins", str(plugins), "--port", str(port), "--pool-size", "3",
                 "--plugin-timeouts", "Hangs=1,BalanceHangs=1,Floods=2", "--request-timeout", "20",
                 "--metrics-port", str(metrics_port), *extra],
                tmp_path / f"run-{port}.log").start()
    stack = Stack(port, plugins, [proc], metrics_port)
    stack.wait_ready()
    return stack
