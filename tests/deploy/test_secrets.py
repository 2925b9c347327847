"""The credentials of the packaged deployments, end to end.

* compose's one-shot ``secrets`` service (deploy/compose/init-secrets.sh) run
  for real: its RabbitMQ definitions loaded at boot by a private RabbitMQ node
  (no guest user), each component's URL file logging in as that component with
  only that component's rights, the gateway's tokens file and first token read
  by the real token store, the console secret read by the gateway, passwords,
  tokens and the console secret kept across re-runs.
* The gateway started with compose's own command and environment refuses to
  start without its tokens file, and with it refuses the API without a token.
* No ``guest`` account and no URL with a password anywhere in compose, the
  chart, the systemd units or the deploy files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import amqp.exceptions
import httpx
import pytest
import yaml
from kombu import Producer

from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.waiting import wait_until
from tests.support.rabbit_private import PrivateRabbit, available
from vmsched.bus.rabbitmq.connection import open_connection
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import AGENT_EXCHANGE, REQUESTS_EXCHANGE
from vmsched.tokens import TokenStore

pytestmark = pytest.mark.rabbitmq

INIT = ROOT / "deploy" / "compose" / "init-secrets.sh"
COMPONENTS = ("gateway", "discovery", "scoring", "balancer")
ADMIN_PASSWORD = "admin-password-for-tests-0123"
VMSCHED = str(Path(sys.executable).parent / "vmsched")


def run_init(secrets: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "SECRETS": str(secrets), "VMSCHED": VMSCHED,
            "SERVICE_UID": str(os.getuid()), "RABBITMQ_ADMIN_PASSWORD": ADMIN_PASSWORD, **env}
    return subprocess.run(["bash", str(INIT)], env=full, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def bootstrapped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateRabbit, Path]]:
    why = available()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("compose-secrets")
    secrets = base / "secrets"
    out = run_init(secrets, VMSCHED_AGENT_HOSTS="hv-1, hv-2", VMSCHED_BROKER_ADDRESS="sched.example.com:5672")
    assert out.returncode == 0, out.stderr
    # RabbitMQ as compose runs it: definitions loaded at boot, on an empty data directory
    conf = (ROOT / "deploy" / "rabbitmq" / "definitions.conf").read_text()
    compose_path = re.search(r"^load_definitions\s*=\s*(\S+)$", conf, re.M).group(1)
    assert compose_path.endswith("/definitions.json")
    node = PrivateRabbit.start_new(base / "node", extra_config=(
        f"load_definitions = {secrets / 'rabbitmq' / 'definitions.json'}",))
    try:
        yield node, secrets
    finally:
        node.stop()


def component_url(node: PrivateRabbit, secrets: Path, component: str) -> str:
    url = (secrets / component / "amqp.url").read_text().strip()
    assert "@rabbitmq:5672/" in url, "compose's services reach the broker by its service name"
    return url.replace("@rabbitmq:5672/", f"@localhost:{node.port}/")


def publish(url: str, exchange: object, key: str) -> None:
    with open_connection(BusOptions(url=url), blocking_confirms=True) as conn:
        Producer(conn.default_channel, auto_declare=False).publish(b"{}", exchange=exchange, routing_key=key,
                                                                   retry=False, confirm_timeout=5)


def test_the_broker_has_one_user_per_component_and_no_guest(bootstrapped: tuple[PrivateRabbit, Path]) -> None:
    node, secrets = bootstrapped
    users = {line.split()[0] for line in node.ctl("list_users").stdout.splitlines() if line.strip()} - {"user"}
    assert users == {*(f"vmsched-{c}" for c in COMPONENTS), "vmsched-agent-hv-1", "vmsched-agent-hv-2",
                     "vmsched-admin"}
    exchanges = node.ctl("list_exchanges", "name").stdout.split()
    assert {"vmsched.requests", "vmsched.agent", "vmsched.reply", "vmsched.events"} <= set(exchanges)
    # the definitions hold hashes only; each URL file holds only its own user's password
    definitions = (secrets / "rabbitmq" / "definitions.json").read_text()
    urls = {c: (secrets / c / "amqp.url").read_text() for c in COMPONENTS}
    for component, url in urls.items():
        password = (secrets / "broker" / f"vmsched-{component}").read_text().strip()
        assert password not in definitions
        assert f"//vmsched-{component}:{password}@" in url
        assert oct((secrets / component / "amqp.url").stat().st_mode & 0o777) == "0o400"
    assert len({u.split("@")[0] for u in urls.values()}) == len(COMPONENTS)
    assert ADMIN_PASSWORD not in definitions
    # the hypervisors' agents get URLs for the published address
    agent_url = (secrets / "operator" / "vmsched-agent-hv-1.url").read_text()
    assert agent_url.startswith("amqp://vmsched-agent-hv-1:") and "@sched.example.com:5672/" in agent_url


def test_each_url_file_logs_in_with_only_its_components_rights(bootstrapped: tuple[PrivateRabbit, Path]) -> None:
    node, secrets = bootstrapped
    gateway = component_url(node, secrets, "gateway")
    publish(gateway, AGENT_EXCHANGE, "hv-1")
    publish(gateway, REQUESTS_EXCHANGE, "vmsched.score.v2")
    for component in ("discovery", "scoring", "balancer"):
        with pytest.raises(amqp.exceptions.AccessRefused, match="ACCESS_REFUSED"):
            publish(component_url(node, secrets, component), AGENT_EXCHANGE, "hv-1")
    agent = (secrets / "operator" / "vmsched-agent-hv-1.url").read_text().strip()
    agent = agent.replace("@sched.example.com:5672/", f"@localhost:{node.port}/")
    with pytest.raises(amqp.exceptions.AccessRefused, match="ACCESS_REFUSED"):
        publish(agent, AGENT_EXCHANGE, "hv-2")


def test_the_tokens_file_holds_the_first_tokens_digest_only(bootstrapped: tuple[PrivateRabbit, Path]) -> None:
    _, secrets = bootstrapped
    tokens = secrets / "gateway-tokens" / "tokens.yaml"
    token = (secrets / "operator" / "admin.token").read_text().strip()
    assert token and token not in tokens.read_text()
    store = TokenStore(tokens)
    identity = store.by_token(token)
    assert identity is not None and identity.name == "admin"
    assert store.by_token(token + "x") is None
    assert oct(tokens.stat().st_mode & 0o777) == "0o600"


def test_a_rerun_keeps_passwords_and_tokens(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    assert run_init(secrets).returncode == 0
    first = {c: (secrets / c / "amqp.url").read_text() for c in COMPONENTS}
    tokens = (secrets / "gateway-tokens" / "tokens.yaml").read_text()
    console = (secrets / "gateway-console" / "console.secret").read_text()
    again = run_init(secrets)
    assert again.returncode == 0, again.stderr
    assert {c: (secrets / c / "amqp.url").read_text() for c in COMPONENTS} == first
    assert (secrets / "gateway-tokens" / "tokens.yaml").read_text() == tokens
    assert (secrets / "gateway-console" / "console.secret").read_text() == console, "sessions survive a re-run"
    assert "made the gateway's tokens file" not in again.stderr


@pytest.mark.parametrize("password", ["", "short", "has space in it 0123456789"])
def test_a_bad_admin_password_stops_the_bootstrap(tmp_path: Path, password: str) -> None:
    out = run_init(tmp_path / "secrets", RABBITMQ_ADMIN_PASSWORD=password)
    assert out.returncode == 2 and "RABBITMQ_ADMIN_PASSWORD" in out.stderr
    assert not (tmp_path / "secrets" / "gateway" / "amqp.url").exists()


# --- the gateway as compose runs it ------------------------------------------------------------------
def compose_gateway() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["gateway"]


def start_compose_gateway(tmp_path: Path, tokens: Path, console: Path) -> tuple[subprocess.Popen[str], int]:
    gw = compose_gateway()
    url_file = tmp_path / "amqp.url"
    url_file.write_text("memory://\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMSCHED_")}
    env.update({k: v for k, v in gw["environment"].items() if "${" not in str(v)})
    env.update(VMSCHED_AMQP_URL_FILE=str(url_file), VMSCHED_TOKENS_FILE=str(tokens),
               VMSCHED_CONSOLE_SECRET_FILE=str(console), PYTHONPATH=str(ROOT))
    port = free_port()
    # compose's command, on free local ports
    args = [*gw["command"], "--host", "127.0.0.1", "--port", str(port), "--metrics-host", "127.0.0.1",
            "--metrics-port", "0"]
    proc = subprocess.Popen([sys.executable, "-P", "-m", "vmsched.cli", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, port


def test_the_compose_gateway_refuses_to_start_without_its_tokens_file(tmp_path: Path) -> None:
    assert compose_gateway()["environment"]["VMSCHED_TOKENS_FILE"]
    proc, _ = start_compose_gateway(tmp_path, tmp_path / "tokens.yaml", tmp_path / "console.secret")  # not made
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2, out
    assert "tokens file" in out and "vmsched token new" in out


def test_the_compose_gateway_refuses_to_start_without_its_console_secret(tmp_path: Path) -> None:
    assert compose_gateway()["environment"]["VMSCHED_CONSOLE_SECRET_FILE"]
    secrets = tmp_path / "secrets"
    assert run_init(secrets).returncode == 0
    proc, _ = start_compose_gateway(tmp_path, secrets / "gateway-tokens" / "tokens.yaml", tmp_path / "missing")
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2, out
    assert "vmsched: error: console secret file" in out and "vmsched console-secret --file" in out
    assert "Traceback" not in out


def test_the_compose_gateway_needs_the_made_token(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    assert run_init(secrets).returncode == 0
    token = (secrets / "operator" / "admin.token").read_text().strip()
    console = secrets / "gateway-console" / "console.secret"
    assert oct(console.stat().st_mode & 0o777) == "0o400" and len(console.read_text().strip()) >= 32
    proc, port = start_compose_gateway(tmp_path, secrets / "gateway-tokens" / "tokens.yaml", console)
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=60)
        assert httpx.get(f"{base}/v1/units", timeout=5).status_code == 401
        assert httpx.get(f"{base}/v1/units", headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
        # with the token: past authentication (an unknown route is then 404, not 401)
        ok = httpx.get(f"{base}/v1/no-such-route", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert ok.status_code == 404, ok.text
    finally:
        proc.kill()
        proc.wait(10)


# --- no default credentials anywhere ---------------------------------------------------------------------
CREDENTIALS = re.compile(r"guest:guest|RABBITMQ_DEFAULT_(USER|PASS)|amqps?://[^\s/@'\"]*:[^\s/@'\"]*@", re.I)


def deployment_files() -> list[Path]:
    files = [ROOT / "compose.yaml", ROOT / "Dockerfile"]
    for folder in (ROOT / "deploy", ROOT / "charts"):
        files += [p for p in folder.rglob("*") if p.is_file()]
    return sorted(set(files))


def test_no_guest_account_and_no_url_with_a_password_in_any_deployment_file() -> None:
    files = deployment_files()
    assert len(files) > 20 and ROOT / "deploy" / "vmsched.env.example" in files
    assert CREDENTIALS.search("amqp://guest:guest@127.0.0.1:5672//") and CREDENTIALS.search("amqp://u:p@h/")
    found = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if CREDENTIALS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
