"""Shadow comparisons for tests: the event's body, and a gateway app in this process whose bus a test publishes on.

:func:`gateway_in_process` runs the gateway app (its lifespan included) with the discovery and scoring services on
one in-process transport, as ``vmsched run`` does, so a test makes a real scheduling call and then publishes a
comparison with that decision's ID through ``transport.events(...)``, as a shadow candidate's service does.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from fastapi.testclient import TestClient

from tests.gateway.console.test_sessions import OTHER, TOKEN, write_tokens
from tests.support.paths import TEST_PLUGINS
from tests.support.stack import AUTH, TEST_TOKEN
from tests.support.waiting import wait_until
from vmsched.bus.inprocess import InProcessTransport
from vmsched.bus.interface import Transport
from vmsched.cli.runner import make_service
from vmsched.config import Settings
from vmsched.gateway.app import create_app
from vmsched.messages import SHADOW_KEY
from vmsched.tokens import TokenStore

VM = "11111111-2222-3333-4444-555555555555"
HOSTS = [f"dddddddd-0000-0000-0000-00000000000{i}" for i in range(5)]


def comparison(record_id: str, **fields: Any) -> dict[str, Any]:
    """A changed filter comparison's event body (``service`` and ``time`` left to the event's sender)."""
    body: dict[str, Any] = {
        "v": 2, "id": record_id, "op": "filter", "vm": VM, "hosts": 5, "status": "changed",
        "what": f"keeps 2 hosts (baseline 3): drops {HOSTS[2]}", "candidate": "candidate-plugins",
        "change": ["KeepEven left out"], "seconds": 0.004,
        "rows": [{"host": HOSTS[2], "live": {"KeepEven": "kept", "result": "kept"},
                  "candidate": {"KeepEven": "dropped: free 1 GiB < 4 GiB", "result": "dropped"}}],
    }
    body.update(fields)
    return body


def publish(transport: Transport, body: dict[str, Any], service: str = "scoring") -> None:
    """Publish ``body`` as the ``service`` running the candidate does: key ``shadow.<service>``."""
    events = transport.events(service)
    try:
        assert events.publish(SHADOW_KEY + service, body), "the event was dropped"
    finally:
        events.close()


@dataclass
class InProcess:
    """A gateway app and its services on one in-process bus, and a client of the app with every role."""

    transport: InProcessTransport
    client: TestClient
    settings: Settings

    def get(self, path: str, **kw: Any) -> Any:
        return self.client.get(path, **{"headers": AUTH, **kw})

    def decide(self, vm: str, units: list[str] | None = None) -> str:
        """A real filter call through the JSON API; its decision's ID (from the decision log)."""
        r = self.client.post("/v1/filter", headers=AUTH,
                             json={"units": units or ["KeepEven"], "hosts": HOSTS, "vm": vm})
        assert r.status_code == 200 and r.json()["result_code"] == 0, r.text
        (found,) = self.get("/v1/decisions", params={"vm": vm}).json()["decisions"]
        return found["id"]

    def wait_shadow(self, record_id: str) -> dict[str, Any]:
        """The comparison of ``record_id`` once the gateway has it."""
        return wait_until(lambda: (r := self.get(f"/v1/shadow/{record_id}")).status_code == 200 and r.json(),
                          10, 0.05, f"the comparison of {record_id}")


def three_users(tmp: Path, tests_roles: str) -> Path:
    """A tokens file: ``tests`` (AUTH's token) with ``tests_roles``, ``reader`` (``TOKEN``, read) and ``ci``
    (``OTHER``, schedule)."""
    tokens = tmp / "tokens.yaml"
    write_tokens(tokens, ("tests", TEST_TOKEN, tests_roles), ("reader", TOKEN, "read"), ("ci", OTHER, "schedule"))
    return tokens


@contextmanager
def gateway_in_process(tmp: Path, tokens: Path, **settings: Any) -> Iterator[InProcess]:
    plugins = tmp / "plugins"
    shutil.copytree(TEST_PLUGINS, plugins, ignore=shutil.ignore_patterns("__pycache__"))
    config = Settings(amqp_url="memory://", tokens_file=tokens, plugins_dir=plugins, pool_size=1,
                      runtime_dir=tmp / "runtime", **settings)
    transport = InProcessTransport()
    services = [make_service(name, config, transport) for name in ("discovery", "scoring")]
    for service in services:
        service.start()
    try:
        app = create_app(config, transport, tokens=TokenStore(tokens, check_interval=0))
        with TestClient(app, follow_redirects=False) as client:
            gateway = InProcess(transport, client, config)
            wait_until(lambda: gateway.get("/readyz").status_code == 200, 30, 0.1, "the services to answer")
            wait_until(lambda: app.app.app.state.shadow.ready.is_set(), 10, 0.05, "the shadow subscription")
            yield gateway
    finally:
        for service in services:
            service.stop()
