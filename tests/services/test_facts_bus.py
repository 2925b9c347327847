"""Host facts end to end on the real RabbitMQ, with two agents on libvirt's test driver.

Real processes: two agents (different host IDs), the scoring service and the
gateway. Proven: the agents publish facts; the gateway's /v1/facts and the
scoring service's cache hold them; a plugin reading facts (FewestGuests)
changes its decision, through XML-RPC, when guests start on one host; a
stopped agent's host turns stale and units see it; malformed, oversized,
old-version and out-of-order messages are dropped with a log line and a
metric, and the cache keeps working; an agent cannot speak for another host
(the message's host must be the routing key's, which broker permissions tie to
the agent's user). The real-QEMU case is in
tests/e2e/libvirt/test_facts.py.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.agents import EventTap, agent
from tests.support.net import free_port
from tests.support.stack import Proc, Stack, bus_args
from tests.support.waiting import wait_until
from tests.support.facts import publish_events
from vmsched.facts.model import FACTS_VERSION, MAX_BYTES

pytestmark = pytest.mark.rabbitmq

pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")

PLUGIN = '''
from vmsched.plugin import facts


class FewestGuests:
    """Cost = running guests; a host without fresh facts costs 1000."""

    def do_score(self, hosts, vm, args):
        out = []
        for h in hosts:
            f = facts.host(h)
            out.append((h, 1000 if f is None or f.stale else f.guests_running))
        return out


class FreshFacts:
    """Keeps hosts whose facts are fresh."""

    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if facts.host(h) is not None and not facts.host(h).stale]
'''


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def stack(tmp_path: Path, rabbit_vhost: str):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "fewest.py").write_text(PLUGIN)
    port, metrics_port = free_port(), free_port()
    common = [*bus_args(tmp_path, rabbit_vhost), "--facts-max-age", "2"]
    gateway = Proc(["gateway", "--port", str(port), *common], tmp_path / "gateway.log",
                   env={"VMSCHED_AMQP_URL": ""}).start()
    scoring = Proc(["scoring", "--plugins", str(plugins), "--pool-size", "2", "--metrics-port", str(metrics_port),
                    *common], tmp_path / "scoring.log", env={"VMSCHED_AMQP_URL": ""}).start()
    s = Stack(port, plugins, [gateway, scoring], metrics_port)
    s.wait_ready(queues=("vmsched.filter.v2", "vmsched.score.v2"))
    yield s
    s.stop()


def facts_of(stack: Stack, host: str) -> dict | None:
    r = stack.get(f"/v1/hosts/{host}/facts")
    return r.json() if r.status_code == 200 else None


def best(stack: Stack, hosts: list[str]) -> tuple[str, dict[str, float]]:
    """The cheapest host by FewestGuests, through XML-RPC like the engine."""
    reply = stack.xmlrpc("runCostFunctions", [["FewestGuests", 1]], hosts, "", {})
    assert not reply.get("plugin_errors"), reply
    scores = {h: float(s) for h, s in reply["result"]}
    return min(scores, key=lambda h: scores[h]), scores


def filtered(stack: Stack, hosts: list[str]) -> list[str]:
    reply = stack.xmlrpc("runFilters", ["FreshFacts"], hosts, "", {})
    assert not reply.get("plugin_errors"), reply
    return reply["result"]


def test_facts_drive_a_plugin_through_xmlrpc(tmp_path: Path, rabbit_vhost: str, stack: Stack) -> None:
    hosts = ["hv-a", "hv-b"]
    a = agent(tmp_path, rabbit_vhost, "hv-a", [("a1", 256), ("a2", 512), ("a3", 512)])
    b = agent(tmp_path, rabbit_vhost, "hv-b", [("b1", 256), ("b2", 256)])
    stack.procs += [a, b]
    wait_until(lambda: facts_of(stack, "hv-a") and facts_of(stack, "hv-b"), 30, 0.1, "facts of both agents")
    seen = stack.get("/v1/facts").json()
    assert {h["host_id"] for h in seen["hosts"]} == set(hosts) and seen["stale"] == 0
    fa = facts_of(stack, "hv-a")
    assert fa["host"]["guests_running"] == 3 and fa["host"]["memory_total_mib"] > 0 and fa["version"] == FACTS_VERSION
    assert fa["source"].startswith("agent hv-a") and {g["name"] for g in fa["guests"]} == {"a1", "a2", "a3"}

    # two guests of hv-a stop: it has the fewest guests, the unit (in the scoring service, via its cache) picks it
    for guest in ("a2", "a3"):
        r = stack.post(f"/v1/hosts/hv-a/domains/{guest}/stop", json={"wait": 10, "force": True})
        assert r.status_code == 200, r.text
    wait_until(lambda: best(stack, hosts)[1] == {"hv-a": 1.0, "hv-b": 2.0}, 10, 0.1, "hv-a with 1 guest, hv-b 2")
    assert best(stack, hosts)[0] == "hv-a"
    before = facts_of(stack, "hv-a")["host"]

    # they start again on hv-a: within one interval the guest count and memory change, and the decision flips
    for guest in ("a2", "a3"):
        r = stack.post(f"/v1/hosts/hv-a/domains/{guest}/start", json={"wait": 10})
        assert r.status_code == 200, r.text
    wait_until(lambda: best(stack, hosts)[0] == "hv-b", 10, 0.1, "hv-b to become the cheaper host")
    # the gateway's cache hears the same message as the scoring service's, not at the same instant
    wait_until(lambda: facts_of(stack, "hv-a")["host"]["guests_running"] == 3, 10, 0.1, "the gateway's facts too")
    after = facts_of(stack, "hv-a")["host"]
    assert after["guests_running"] == 3 and after["guest_memory_mib"] == before["guest_memory_mib"] + 1024

    # an unknown host: no facts, the reason says so (never a guess)
    missing = stack.get("/v1/hosts/hv-z/facts")
    assert missing.status_code == 404 and "no agent reports host 'hv-z'" in missing.json()["detail"]["error"]
    assert filtered(stack, [*hosts, "hv-z"]) == hosts

    # stop hv-b's agent: after --facts-max-age (2 s) it is stale, in the JSON API and for units
    b.kill(signal.SIGTERM)
    wait_until(lambda: facts_of(stack, "hv-b")["stale"], 10, 0.2, "hv-b to turn stale")
    assert stack.get("/v1/facts").json()["stale"] == 1
    assert filtered(stack, hosts) == ["hv-a"]
    assert best(stack, hosts)[1]["hv-b"] == 1000.0
    metrics = httpx.get(f"{stack.metrics_url}/metrics", timeout=10).text
    assert metric(metrics, "vmsched_facts_hosts_stale", service="scoring") == 1
    assert metric(metrics, "vmsched_facts_received_total", service="scoring") > 2
    assert 'vmsched_facts_age_seconds{host="hv-a",service="scoring"}' in metrics


def test_bad_facts_messages_are_dropped_and_never_break_the_cache(tmp_path: Path, rabbit_vhost: str,
                                                                   stack: Stack) -> None:
    tap = EventTap(rabbit_vhost, "agent.hv-c.facts")
    c = agent(tmp_path, rabbit_vhost, "hv-c", [("c1", 256)])
    stack.procs.append(c)
    try:
        wait_until(lambda: len(tap.events) >= 2 and facts_of(stack, "hv-c"), 30, 0.1, "facts of hv-c")
        old = tap.events[0][1]
    finally:
        tap.close()
    newer = dict(old, v=FACTS_VERSION + 1)
    cases = {
        "malformed": [b"{not json", json.dumps([1, 2]).encode(), json.dumps({**old, "seq": "many"}).encode(),
                      json.dumps({**old, "host": {"cpu_pct": -5}}).encode()],
        "oversized": [b" " * (MAX_BYTES + 1)],
        "version": [json.dumps(newer).encode()],
        "out_of_order": [json.dumps(old).encode()],  # a replay of an older message of the same agent instance
        "host_mismatch": [json.dumps({**old, "seq": 10**9}).encode()],  # hv-c's facts under another host's key
    }
    publish_events(rabbit_vhost, [("agent.hv-d.facts" if reason == "host_mismatch" else "agent.hv-c.facts", body)
                                  for reason, messages in cases.items() for body in messages])

    def dropped() -> dict[str, float]:
        text = httpx.get(f"{stack.metrics_url}/metrics", timeout=10).text
        return {reason: metric(text, "vmsched_facts_dropped_total", service="scoring", reason=reason)
                for reason in cases}

    wait_until(lambda: dropped() == {k: float(len(v)) for k, v in cases.items()}, 15, 0.2, "every bad message counted")
    log = stack.procs[1].output()
    for reason in cases:
        assert re.search(rf"facts message dropped \({reason}\)", log), reason
    # the cache still works: hv-c's facts keep coming and stay fresh, in the service and the gateway
    seq = facts_of(stack, "hv-c")["seq"]
    wait_until(lambda: facts_of(stack, "hv-c")["seq"] > seq, 10, 0.1, "newer facts of hv-c")
    assert not facts_of(stack, "hv-c")["stale"]
    assert best(stack, ["hv-c"]) == ("hv-c", {"hv-c": 1.0})
