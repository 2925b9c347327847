"""Shared fixtures: real vmsched processes on the embedded bus and on RabbitMQ."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import xmlrpc.client
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.support.engine_wire import call
from vmsched.runner import service_queues

ROOT = Path(__file__).resolve().parent.parent
if os.geteuid() == 0:  # as root, workers switch to `nobody`, who cannot read a Python under /root
    # (a pyenv install, say), so services started by tests run plugins as root without capabilities instead;
    # tests/runtime/test_sandbox.py covers the switch itself with a Python `nobody` can read.
    os.environ.setdefault("VMSCHED_ALLOW_ROOT_PLUGINS", "true")
TEST_PLUGINS = Path(__file__).resolve().parent / "plugins"
#: The shared test broker; VMSCHED_TEST_RABBIT=HOST:PORT points the tests elsewhere
#: (e.g. at a closed port, to check that the fast tier never needs it).
RABBIT_HOST, _, _RABBIT_PORT = os.environ.get("VMSCHED_TEST_RABBIT", "127.0.0.1:5672").rpartition(":")
RABBIT_PORT = int(_RABBIT_PORT)
RABBIT_URL = f"amqp://guest:guest@{RABBIT_HOST}:{RABBIT_PORT}/"
#: The queues the services consume, as they declare them (``QUEUES``).
SERVICE_QUEUES = service_queues()
ALL_QUEUES = tuple(q for queues in SERVICE_QUEUES.values() for q in queues)
SCORING_QUEUES = SERVICE_QUEUES["discovery"] + SERVICE_QUEUES["scoring"]

#: The JSON API needs a bearer token: every process a test starts gets a tokens file holding
#: TEST_TOKEN with all roles, and the Stack helpers send it (docs/api-auth.md).
TEST_TOKEN = "vmsched-test-token-all-roles"
AUTH = {"Authorization": f"Bearer {TEST_TOKEN}"}
#: Environment of every Proc: the tokens file, and an ephemeral gateway metrics port (no clash on 9100).
TEST_ENV: dict[str, str] = {"VMSCHED_METRICS_PORT": "0"}


@pytest.fixture(scope="session", autouse=True)
def test_tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vmsched.tokens import digest

    path = tmp_path_factory.mktemp("tokens") / "tokens.yaml"
    path.write_text(f"tokens:\n  - name: tests\n    roles: [read, schedule, operate]\n"
                    f"    sha256: {digest(TEST_TOKEN)}\n")
    TEST_ENV["VMSCHED_TOKENS_FILE"] = str(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rabbit_up() -> bool:
    try:
        socket.create_connection((RABBIT_HOST, RABBIT_PORT), timeout=1).close()
        return True
    except OSError:
        return False


def console_login(client: httpx.Client, token: str = TEST_TOKEN) -> httpx.Response:
    """Log in to the console as a browser does: the login form's CSRF token, then the token (303 when it works)."""
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
    assert found, "the login form has no CSRF token"
    return client.post("/login", data={"token": token, "csrf": found.group(1)})


def wait_until(predicate: Any, timeout: float = 20.0, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


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


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    """An empty plugins folder for a test to write plugin files into."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    return folder


def plugin_copy(tmp_path: Path) -> Path:
    target = tmp_path / "plugins"
    shutil.copytree(TEST_PLUGINS, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@contextmanager
def private_vhost(prefix: str) -> Iterator[str]:
    """A vhost of its own on the shared test broker (guest may use it), deleted after: its name."""
    if not rabbit_up():
        pytest.fail(f"RabbitMQ is not running on {RABBIT_HOST}:{RABBIT_PORT} (scripts/test starts it)")
    vhost = f"{prefix}-{uuid.uuid4().hex[:8]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
    subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
                   check=True, capture_output=True)
    try:
        yield vhost
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)


@pytest.fixture(scope="session")
def rabbit_vhost() -> Iterator[str]:
    """A private vhost on the real broker, so test stacks never share queues."""
    with private_vhost("vmsched-test") as vhost:
        yield RABBIT_URL + vhost


def bus_args(folder: Path, url: str) -> list[str]:
    """Command-line options that put a process on ``url``: a password goes in a file, never on the command line."""
    if url.startswith("memory://"):
        return ["--amqp", url]
    path = folder / f"amqp-url-{uuid.uuid4().hex[:8]}"
    path.write_text(url + "\n")
    path.chmod(0o600)
    return ["--amqp-url-file", str(path)]


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


#: The two buses a test runs on, as fixture parameters: the ``rabbitmq`` case needs the broker.
BUSES = ["memory", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]


@pytest.fixture(scope="module", params=BUSES)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The all-in-one process on the embedded bus, then on RabbitMQ (one per test module)."""
    bus = "memory://" if request.param == "memory" else request.getfixturevalue("rabbit_vhost")
    s = start_all_in_one(tmp_path_factory.mktemp(request.param), bus)
    yield s
    s.stop()
