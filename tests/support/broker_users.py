"""A private RabbitMQ node with the least-privilege users of deploy/rabbitmq/setup-users.sh.

Users are global to a broker, so tests of them never touch the shared one. The ``broker``
fixture (import it into a test module) starts one node per module and runs the real script
on it; ``url`` and ``publish`` act as one of its users.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from kombu import Producer

from tests.support.paths import ROOT
from tests.support.rabbit_private import PrivateRabbit, available, tool
from vmsched.bus.rabbitmq.connection import open_connection
from vmsched.bus.options import BusOptions

SCRIPT = ROOT / "deploy" / "rabbitmq" / "setup-users.sh"
HOSTS = ("hv-a", "hv-b")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateRabbit, Path]]:
    why = available()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("rabbit-perms")
    node = PrivateRabbit.start_new(base / "node")
    secrets = base / "secrets"
    try:
        args = [str(SCRIPT), "--secrets", str(secrets), "--vhost", "vmsched", "--broker", f"localhost:{node.port}",
                "--delete-guest"]
        for host in HOSTS:
            args += ["--agent", host]
        env = {**node.env(), "RABBITMQCTL": f"{tool('rabbitmqctl')} -n {node.node}"}
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        yield node, secrets
    finally:
        node.stop()


def url(secrets: Path, user: str) -> str:
    return (secrets / f"{user}.url").read_text().strip()


def publish(secrets: Path, user: str, exchange: object, key: str) -> None:
    """One confirmed publish as ``user`` (raises the broker's refusal)."""
    with open_connection(BusOptions(url=url(secrets, user)), blocking_confirms=True) as conn:
        Producer(conn.default_channel, auto_declare=False).publish(b"{}", exchange=exchange, routing_key=key,
                                                                   retry=False, confirm_timeout=5)
