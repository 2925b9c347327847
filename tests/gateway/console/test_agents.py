"""The console's agents section, with an agent on libvirt's test driver over the real RabbitMQ."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.stack import TEST_TOKEN, console_login, start_all_in_one
from tests.support.waiting import wait_until
from tests.support.agents import agent

pytestmark = pytest.mark.rabbitmq

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")

HOST = "hv-console"


def test_agents_pool_and_policies_are_shown(tmp_path: Path, rabbit_vhost: str) -> None:
    stack = start_all_in_one(tmp_path, rabbit_vhost)
    proc = agent(tmp_path, rabbit_vhost, HOST, [("db", 512), ("web", 256)])
    try:
        wait_until(lambda: stack.get(f"/v1/hosts/{HOST}/facts").status_code == 200, 30, 0.2, "the agent's facts")
        r = httpx.put(f"{stack.url}/v1/hosts/{HOST}/cpus", json={"dedicated_pool": "2-3"},
                      headers={"Authorization": f"Bearer {TEST_TOKEN}"}, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.put(f"{stack.url}/v1/hosts/{HOST}/policies/web", json={"dedicated": 1},
                      headers={"Authorization": f"Bearer {TEST_TOKEN}"}, timeout=30)
        assert r.status_code == 200, r.text
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            assert console_login(client).status_code == 303
            page = client.get("/").text
        section = page[page.index('<section id="agents">'):]
        section = section[:section.index("</section>")]
        assert f'data-host="{HOST}"' in section
        assert "dedicated pool <code>2-3</code>" in section
        assert "<td>web</td>" in section and "dedicated=1" in section
    finally:
        proc.kill()
        stack.stop()
