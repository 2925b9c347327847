"""/v1/facts names, per host, the engine host IDs that resolve to it, and how (docs/facts.md, "The JSON API").

Also the decision log's bulk ``FactsCache.ages`` (the same answers as resolving host by host).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from vmsched.facts.model import FactsMessage, HostFacts
from vmsched.facts.cache import FactsCache
from vmsched.gateway import facts_api


def message(host: str, seq: int = 1, collected: float | None = None) -> bytes:
    return FactsMessage(host_id=host, instance="i1", seq=seq, time=time.time() if collected is None else collected,
                        interval=5.0, host=HostFacts(hostname=host)).model_dump_json().encode()


class FakeLink:
    """An engine link that already mapped some engine hosts (vmsched.engine_link.EngineLink's read side)."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = hosts

    def host(self, engine_id: str) -> tuple[str | None, str]:
        found = self.hosts.get(engine_id)
        return (found, "engine link") if found else (None, "the engine link knows no agent for it")

    def vm(self, vm_id: str) -> tuple[dict[str, Any] | None, str]:
        return None, "not known"

    def mapped(self) -> dict[str, str]:
        return dict(self.hosts)

    def stop(self) -> None:
        pass


def cache_with_every_kind() -> FactsCache:
    link = FakeLink({"guid-link": "hv2", "guid-map": "hv3", "hv1": "hv3", "guid-nobody": "gone"})
    cache = FactsCache("ids", host_map={"guid-map": "hv1", "guid-absent": "hv9"}, link=link)
    for host in ("hv1", "hv2", "hv3"):
        assert cache.ingest(message(host))
    return cache


def test_engine_ids_follow_the_resolution_order() -> None:
    cache = cache_with_every_kind()
    ids = cache.engine_ids()
    assert ids["hv1"] == [{"id": "hv1", "via": "agent"}, {"id": "guid-map", "via": "host map"}]
    assert ids["hv2"] == [{"id": "hv2", "via": "agent"}, {"id": "guid-link", "via": "engine link"}]
    # the link's guid-map is shadowed by the host map, its hv1 by the agent hv1: neither reaches hv3
    assert ids["hv3"] == [{"id": "hv3", "via": "agent"}]
    assert set(ids) == {"hv1", "hv2", "hv3"}  # agents without facts (hv9, gone) are not listed
    for agent, listed in ids.items():  # what is listed is what a request naming it resolves to
        for item in listed:
            assert cache.resolve(item["id"])[1] == agent, item


def test_v1_facts_lists_the_engine_ids_of_each_host() -> None:
    app = FastAPI()
    app.state.facts = cache_with_every_kind()
    app.include_router(facts_api.router)
    client = TestClient(app)
    listed = {h["host_id"]: h["engine_host_ids"] for h in client.get("/v1/facts").json()["hosts"]}
    assert listed["hv2"] == [{"id": "hv2", "via": "agent"}, {"id": "guid-link", "via": "engine link"}]
    one = client.get("/v1/hosts/guid-map/facts").json()
    assert one["agent_host_id"] == "hv1" and one["source"].endswith("; host map")
    assert {"id": "guid-map", "via": "host map"} in one["engine_host_ids"]


def test_bulk_ages_match_host_by_host() -> None:
    cache = FactsCache("ages", host_map={"guid-1": "hv1"})
    now = time.time()
    cache.ingest(message("hv1", collected=now - 2.5))
    cache.ingest(message("hv2", collected=now + 1.0))  # an agent clock ahead of ours: age 0, never negative
    asked = ["hv1", "guid-1", "hv2", "nobody"]
    expected = {h: round(cache.age(e, now), 3) for h in asked if (e := cache.resolve(h)[0]) is not None}
    assert cache.ages(asked, now) == expected == {"hv1": 2.5, "guid-1": 2.5, "hv2": 0.0}
