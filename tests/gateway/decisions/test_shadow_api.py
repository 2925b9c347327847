"""GET /v1/shadow, GET /v1/shadow/{id} and a decision's ``shadow`` field, through the gateway app in process:
a real filter call makes the decision, a comparison with its ID is published on the same in-process bus."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from tests.gateway.console.test_sessions import OTHER, TOKEN, write_tokens
from tests.support.shadow import InProcess, comparison, gateway_in_process, publish, three_users
from tests.support.stack import TEST_TOKEN
from tests.support.waiting import wait_until
from vmsched.gateway.auth import ROUTE_ROLES
from vmsched.tokens import Role


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    tmp = tmp_path_factory.mktemp("shadow-api")
    with gateway_in_process(tmp, three_users(tmp, "read, schedule, operate")) as g:
        yield g


def test_a_decision_read_by_id_carries_its_comparison(gateway: InProcess) -> None:
    vm = str(uuid.uuid4())
    record_id = gateway.decide(vm)
    before = gateway.get(f"/v1/decisions/{record_id}").json()
    assert before["shadow"] is None  # no candidate ran it (yet): null, always present
    publish(gateway.transport, comparison(record_id, vm=vm))
    shown = gateway.wait_shadow(record_id)
    assert shown["id"] == record_id and shown["service"] == "scoring" and shown["status"] == "changed"
    record = gateway.get(f"/v1/decisions/{record_id}").json()
    assert record["shadow"] == shown and record["summary"] == before["summary"]
    assert record["units"][0]["kept"]  # the reader's form is unchanged


def test_the_list_filters_and_counts(gateway: InProcess) -> None:
    vm = str(uuid.uuid4())
    ids = [uuid.uuid4().hex for _ in range(4)]
    publish(gateway.transport, comparison(ids[0], vm=vm, status="same", rows=[]))
    publish(gateway.transport, comparison(ids[1], vm=vm, op="score", rank=2, rows=[]), service="scoring")
    publish(gateway.transport, comparison(ids[2], vm=vm, status="error", what="KeepEven timed out",
                                          errors={"KeepEven": "timed out after 1 s"}, rows=[]))
    publish(gateway.transport, comparison(ids[3], vm=vm, op="balance", status="unknown", rows=[]),
            service="balancer")
    gateway.wait_shadow(ids[3])
    listed = gateway.get("/v1/shadow", params={"vm": vm}).json()
    assert [c["id"] for c in listed["comparisons"]] == ids[::-1] and listed["count"] == 4
    assert set(listed["counts"]) == {"same", "changed", "unknown", "error"}
    assert listed["counts"]["error"] >= 1 and listed["size"] == 10000 and listed["invalid"] == 0
    assert [c["id"] for c in gateway.get("/v1/shadow", params={"vm": vm, "status": "error"}).json()["comparisons"]
            ] == [ids[2]]
    assert [c["id"] for c in gateway.get("/v1/shadow", params={"vm": vm, "op": "score"}).json()["comparisons"]
            ] == [ids[1]]
    assert [c["id"] for c in gateway.get("/v1/shadow", params={"vm": vm, "limit": 2}).json()["comparisons"]
            ] == [ids[3], ids[2]]
    for bad in ({"status": "maybe"}, {"op": "migrate"}, {"limit": 0}, {"limit": 10001}, {"vm": "x" * 513}):
        r = gateway.get("/v1/shadow", params=bad)
        assert r.status_code == 400, (bad, r.text)


def test_an_unknown_comparison_is_a_404_that_says_why(gateway: InProcess) -> None:
    r = gateway.get("/v1/shadow/" + "f" * 32)
    assert r.status_code == 404
    assert "no shadow comparison " + "f" * 32 in r.json()["detail"]["error"]
    assert gateway.get("/v1/shadow/" + "x" * 65).status_code == 400  # not an ID


def test_the_routes_need_the_read_role(gateway: InProcess) -> None:
    assert ROUTE_ROLES[("GET", "/v1/shadow")] is Role.READ
    assert ROUTE_ROLES[("GET", "/v1/shadow/{comparison_id}")] is Role.READ
    for path in ("/v1/shadow", "/v1/shadow/" + "a" * 32):
        assert gateway.client.get(path).status_code == 401
        r = gateway.client.get(path, headers={"Authorization": f"Bearer {OTHER}"})
        assert r.status_code == 403 and "'read' role" in r.json()["detail"]
        assert gateway.client.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code in (200, 404)


def test_openapi_lists_the_routes_with_their_role(gateway: InProcess) -> None:
    paths = gateway.client.get("/openapi.json").json()["paths"]
    for path in ("/v1/shadow", "/v1/shadow/{comparison_id}"):
        op = paths[path]["get"]
        assert op["x-vmsched-role"] == "read" and op["security"] == [{"bearer": []}]
    listed = paths["/v1/shadow"]["get"]
    assert {p["name"] for p in listed["parameters"]} == {"status", "op", "vm", "limit"}


def test_a_comparison_of_a_decision_another_process_made_is_listed_too(gateway: InProcess) -> None:
    """A comparison whose decision is not in this gateway's log is still kept and listed (replicas share none)."""
    record_id = uuid.uuid4().hex
    publish(gateway.transport, comparison(record_id))
    wait_until(lambda: gateway.get(f"/v1/shadow/{record_id}").status_code == 200, 10, 0.05, "the comparison")
    assert gateway.get(f"/v1/decisions/{record_id}").status_code == 404
