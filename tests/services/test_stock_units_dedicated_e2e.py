"""vmsched_DedicatedCpus end to end: two real agents on libvirt's test driver publish their dedicated
pools and guests' policies on RabbitMQ; vmsched (all in one, the stock plugins) filters through XML-RPC as the
engine calls it."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.stack import TEST_TOKEN, start_all_in_one
from tests.support.waiting import wait_until
from tests.support.agents import agent
from vmsched.config import stock_plugins_dir

pytestmark = pytest.mark.rabbitmq

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")

WIDE, NARROW = "hv-wide", "hv-narrow"  # each test-driver node has CPUs 0-3


def test_a_vm_goes_only_where_the_pool_has_its_dedicated_cpus_free(tmp_path: Path, rabbit_vhost: str) -> None:
    stack = start_all_in_one(tmp_path, rabbit_vhost, plugins=stock_plugins_dir())
    procs = [agent(tmp_path, rabbit_vhost, WIDE, [("web", 256)]), agent(tmp_path, rabbit_vhost, NARROW, [("db", 256)])]
    auth = {"Authorization": f"Bearer {TEST_TOKEN}"}

    def put(path: str, body: dict) -> None:
        r = httpx.put(f"{stack.url}{path}", json=body, headers=auth, timeout=30)
        assert r.status_code == 200, r.text

    def host(h: str) -> dict:
        r = stack.get(f"/v1/hosts/{h}/facts")
        return r.json() if r.status_code == 200 else {}

    try:
        wait_until(lambda: host(WIDE) and host(NARROW), 30, 0.2, "both agents' facts")
        put(f"/v1/hosts/{WIDE}/cpus", {"dedicated_pool": "1-3"})
        put(f"/v1/hosts/{NARROW}/cpus", {"dedicated_pool": "3"})
        put(f"/v1/hosts/{WIDE}/policies/web", {"dedicated": 2})
        put(f"/v1/hosts/{NARROW}/policies/db", {"dedicated": 1})
        web = next(g["uuid"] for g in host(WIDE)["guests"] if g["name"] == "web")
        db = next(g["uuid"] for g in host(NARROW)["guests"] if g["name"] == "db")

        def pools() -> tuple:
            w, n = host(WIDE)["host"], host(NARROW)["host"]
            return (w["dedicated_free_cpus"], n["dedicated_free_cpus"], w["dedicated_guests"].get(web),
                    n["dedicated_guests"].get(db))
        plain = {"thread_policy": "prefer", "numa": "any", "emulator": "share"}  # the policies' defaults
        wait_until(lambda: pools() == (1, 0, {"wanted": 2, "held": 2, **plain}, {"wanted": 1, "held": 1, **plain}),
                   30, 0.2, "the pools and policies in the facts")

        def kept(vm: str) -> dict:
            return stack.xmlrpc("runFilters", ["vmsched_DedicatedCpus"], [WIDE, NARROW], vm, {})

        # web needs 2: hv-wide has 1 free plus the 2 web holds; hv-narrow has none free
        assert kept(web)["result"] == [WIDE]
        # db needs 1: hv-wide has 1 free; on hv-narrow db holds its own CPU
        assert kept(db)["result"] == [WIDE, NARROW]
        # a VM no agent knows and no engine link describes: an error, no host dropped
        unknown = kept(str(uuid.uuid4()))
        assert unknown["result"] == [WIDE, NARROW]
        assert "dedicated CPUs of VM" in str(unknown)
    finally:
        for p in procs:
            p.kill()
        stack.stop()
