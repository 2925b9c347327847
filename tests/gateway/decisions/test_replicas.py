"""Two real gateway replicas on a private vhost of the real RabbitMQ: a decision one made is found via the other.

Nothing is published per decision; the gateway asked (API or console) asks
the other replicas over the bus, merges their answers and names a replica
that does not answer in time (docs/console.md, "Several replicas").
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.net import free_port
from tests.support.rabbit import RABBIT_URL, private_vhost
from tests.support.stack import SCORING_QUEUES, Proc, Stack, bus_args, plugin_copy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq

H = [f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(5)]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Stack]]:
    """gw-1 and gw-2 (vmsched gateway), one scoring and one discovery service, on their own vhost."""
    with private_vhost("vmsched-test-replicas") as vhost:
        yield from _replicas(vhost, tmp_path_factory)


def _replicas(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Stack]]:
    tmp = tmp_path_factory.mktemp("replicas")
    plugins = plugin_copy(tmp)
    bus = bus_args(tmp, RABBIT_URL + vhost)
    env = {"VMSCHED_AMQP_URL": ""}
    services = [Proc([name, *bus, "--plugins", str(plugins), "--pool-size", "2"], tmp / f"{name}.log", env=env).start()
                for name in ("discovery", "scoring")]
    stacks = []
    for name in ("gw-1", "gw-2"):
        port = free_port()
        gateway = Proc(["gateway", *bus, "--port", str(port), "--request-timeout", "20"], tmp / f"{name}.log",
                       env={**env, "VMSCHED_GATEWAY_ID": name}).start()
        stacks.append(Stack(port, plugins, [gateway]))
    try:
        for stack in stacks:
            stack.wait_ready(queues=SCORING_QUEUES)
        # each knows the other (their presence on the bus): the gateway says who answered each list
        wait_until(lambda: all(_list(s)["replicas"]["answered"] == sorted(["gw-1", "gw-2"], key=lambda g: g != own)
                               for s, own in zip(stacks, ("gw-1", "gw-2"))), 30, 0.2, "the replicas to know each other")
        yield stacks[0], stacks[1]
    finally:
        for proc in [*services, *(p for s in stacks for p in s.procs)]:
            proc.kill(signal.SIGTERM)


def _list(stack: Stack, **params: str) -> dict[str, Any]:
    r = stack.get("/v1/decisions", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_decision_made_on_one_gateway_is_found_via_the_other(replicas: tuple[Stack, Stack]) -> None:
    gw1, gw2 = replicas
    vm = str(uuid.uuid4())
    assert gw1.xmlrpc("runFilters", ["KeepEven", "KeepAllButLast"], H, vm, {})["result"] == [H[0], H[2]]
    listed = wait_until(lambda: _list(gw2, vm=vm)["decisions"], 10, 0.1, "gw-1's decision via gw-2")
    (found,) = listed
    assert found["gateway"] == "gw-1" and found["summary"].startswith("kept 2 of 5 hosts: KeepEven dropped 2")
    assert {u["unit"]: u["dropped"] for u in found["units"]} == {"KeepEven": [H[1], H[3]], "KeepAllButLast": [H[4]]}
    detail = gw2.get(f"/v1/decisions/{found['id']}")
    assert detail.status_code == 200 and detail.json()["gateway"] == "gw-1"
    assert detail.json()["units"][0]["kept"] == [H[0], H[2], H[4]]  # the reader's form, on the asking gateway
    page = gw2.get("/")
    assert page.status_code == 200 and found["id"] in page.text and "replicas-missing" not in page.text
    assert gw2.get(f"/console/decisions/{found['id']}").status_code == 200

    gw2.xmlrpc("runFilters", ["KeepEven"], H, vm, {})
    wait_until(lambda: len(_list(gw1, vm=vm)["decisions"]) == 2, 10, 0.1, "both decisions via gw-1")
    both = _list(gw1, vm=vm)
    assert {d["gateway"] for d in both["decisions"]} == {"gw-1", "gw-2"} and both["replicas"]["missing"] == []
    assert both["decisions"][0]["time"] >= both["decisions"][1]["time"]  # merged, newest first


def test_a_replica_that_does_not_answer_is_named_and_does_not_hang_the_reader(replicas: tuple[Stack, Stack]) -> None:
    gw1, gw2 = replicas
    vm = str(uuid.uuid4())
    gw1.xmlrpc("runFilters", ["KeepEven"], H, vm, {})
    (found,) = wait_until(lambda: _list(gw2, vm=vm)["decisions"], 10, 0.1, "gw-1's decision via gw-2")
    gw2.xmlrpc("runFilters", ["KeepEven"], H, vm, {})
    wait_until(lambda: len(_list(gw2, vm=vm)["decisions"]) == 2, 10, 0.1, "gw-2's own decision")
    proc = gw1.procs[0].popen
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)  # alive for the broker (its queue stays), but answers nothing
    try:
        listed = _list(gw2, vm=vm)
        assert [d["gateway"] for d in listed["decisions"]] == ["gw-2"]
        assert listed["replicas"]["missing"] == [{"gateway": "gw-1", "error": "no answer within 0.5 s"}]
        assert listed["replicas"]["answered"] == ["gw-2"]
        missing = gw2.get(f"/v1/decisions/{found['id']}")
        assert missing.status_code == 404 and "gw-1: no answer within 0.5 s" in missing.text
        page = gw2.get("/")
        assert page.status_code == 200 and 'id="replicas-missing"' in page.text and "gw-1" in page.text
    finally:
        proc.send_signal(signal.SIGCONT)
    wait_until(lambda: len(_list(gw2, vm=vm)["decisions"]) == 2 and not _list(gw2, vm=vm)["replicas"]["missing"],
               10, 0.1, "gw-1 answering again")
