"""Host facts on the worker pipe, proportional to change (vmsched/facts/wire.py, vmsched/facts/held.py).

A worker is sent each host's facts once per generation; steady-state calls carry host IDs and
generations. Checked here: what each frame carries, that the held form reads exactly like the full
form, that a worker which lost its facts says so and is sent everything again, and, through real
worker processes, that a recycled, crashed or resynced worker never answers from stale facts.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vmsched.facts.model import FactsMessage, GuestFacts, HostFacts
from tests.support.facts import full_form, reading
from vmsched.facts.cache import FactsCache
from vmsched.plugin import facts as api
from vmsched.runtime import Call, PluginPool
from vmsched.facts.held import LOST, HeldFacts
from vmsched.facts.wire import FactsWire
from vmsched.runtime.types import Confinement, Limits


def message(host: str, seq: int, guests: list[GuestFacts] | None = None, age: float = 0.0, **fields: Any) -> bytes:
    return FactsMessage(host_id=host, instance="i1", seq=seq, time=time.time() - age, interval=5.0,
                        host=HostFacts(**fields), guests=guests).model_dump_json().encode()


def fill(cache: FactsCache, seq: int, hosts: list[str], **fields: Any) -> None:
    for host in hosts:
        assert cache.ingest(message(host, seq, **fields))


class FakeWorker:
    """Stands for a worker process: the wire keys what each one holds by the object."""


def frame(wire: FactsWire, worker: object, cache: FactsCache, hosts: list[str], **kw: Any) -> dict[str, Any]:
    return json.loads(wire.encode(worker, cache.prepared(hosts, **kw)))


# --- what each frame carries ---------------------------------------------------------------------------
def test_each_worker_is_sent_a_host_once_per_generation() -> None:
    cache = FactsCache("wire", host_map={"engine-guid": "hv2"})
    fill(cache, 1, ["hv0", "hv1", "hv2"], memory_free_mib=100)
    wire, a, b = FactsWire(), FakeWorker(), FakeWorker()
    hosts = ["hv0", "hv1", "engine-guid", "nope"]
    first = frame(wire, a, cache, hosts)
    assert first["reset"] and set(first["data"]) == {"hv0", "hv1", "engine-guid"} and first["count"] == 3
    assert first["data"]["engine-guid"][1] == "hv2" and "nope" in first["missing"]
    assert first["hosts"] == ["hv0", "hv1", "engine-guid"]
    steady = frame(wire, a, cache, hosts)  # no per-host data at all
    assert "data" not in steady and "reset" not in steady and steady["count"] == 3
    assert steady["same_hosts"] and "hosts" not in steady
    fewer = frame(wire, a, cache, hosts[:2])
    assert fewer["hosts"] == ["hv0", "hv1"] and "data" not in fewer and "same_hosts" not in fewer
    frame(wire, a, cache, hosts)
    fill(cache, 2, ["hv1"], memory_free_mib=50)  # one host's agent sends again: only that host travels
    changed = frame(wire, a, cache, hosts)
    assert set(changed["data"]) == {"hv1"} and changed["count"] == 4 and changed["data"]["hv1"][2]["memory_free_mib"] == 50
    other = frame(wire, b, cache, hosts)  # another worker (or a restarted one) holds nothing yet
    assert other["reset"] and set(other["data"]) == {"hv0", "hv1", "engine-guid"}
    wire.forget(a)  # a worker that answered facts_resync
    again = frame(wire, a, cache, hosts)
    assert again["reset"] and len(again["data"]) == 3 and again["count"] == 3


def test_calls_prepared_before_and_after_a_new_generation_each_get_their_own() -> None:
    """Concurrent requests: one prepared before a host's new message, one after, alternate on one worker.

    Each frame must leave the worker holding exactly its own call's generations (the per-host pass is skipped
    only for a call at the same cache epoch and hosts as the worker's previous one)."""
    cache = FactsCache("wire-epoch")
    fill(cache, 1, ["hv0", "hv1", "hv2"], memory_free_mib=100)
    wire, worker, held = FactsWire(), FakeWorker(), HeldFacts()
    hosts = ["hv0", "hv1", "hv2"]

    def send(call_facts: Any) -> dict[str, Any]:
        payload = json.loads(wire.encode(worker, call_facts))
        held.for_call(payload)
        assert not held.lost
        return payload

    def worker_sees() -> dict[str, int]:
        return {h: held.hosts[h][0] for h in hosts}

    def generations(call_facts: Any) -> dict[str, int]:
        return {h: part.gen for h, part in call_facts.refs.items()}

    old = cache.prepared(hosts)
    assert "data" in send(old) and worker_sees() == generations(old)
    assert "data" not in send(cache.prepared(hosts))  # same epoch, same hosts: nothing per host
    fill(cache, 2, ["hv1"], memory_free_mib=50)
    new = cache.prepared(hosts)
    assert new.epoch != old.epoch
    assert set(send(new)["data"]) == {"hv1"} and worker_sees() == generations(new)
    assert set(send(old)["data"]) == {"hv1"} and worker_sees() == generations(old)  # back to the older one
    assert set(send(new)["data"]) == {"hv1"} and worker_sees() == generations(new)
    assert "data" not in send(new) and worker_sees() == generations(new)
    mapped = FactsCache("wire-epoch-map", host_map={"guid": "hv0"})
    fill(mapped, 1, ["hv0"])
    assert mapped.prepared(["guid"]).epoch == -1  # resolved through the map: never skipped


def test_guest_lists_travel_with_balance_calls_only_and_when_they_change() -> None:
    cache = FactsCache("wire-guests")
    g = GuestFacts(uuid="u1", name="vm1", state="running", vcpus=2, memory_mib=1024)
    assert cache.ingest(message("hv0", 1, guests=[g]))
    wire, worker = FactsWire(), FakeWorker()
    assert "guests" not in frame(wire, worker, cache, ["hv0"])
    balance = frame(wire, worker, cache, ["hv0"], with_guests=True)
    assert balance["guests"]["hv0"][1][0]["uuid"] == "u1" and balance["with_guests"]
    assert cache.ingest(message("hv0", 2))  # a summary without guests: the list stays, it is not resent
    summary = frame(wire, worker, cache, ["hv0"], with_guests=True)
    assert "guests" not in summary and set(summary["data"]) == {"hv0"}
    assert cache.ingest(message("hv0", 3, guests=[]))
    assert frame(wire, worker, cache, ["hv0"], with_guests=True)["guests"]["hv0"][1] == []


def test_a_worker_holding_too_many_hosts_is_reset() -> None:
    cache = FactsCache("wire-bound")
    fill(cache, 1, [f"hv{i}" for i in range(6)])
    wire, worker = FactsWire(max_held=4), FakeWorker()
    frame(wire, worker, cache, ["hv0", "hv1", "hv2"])
    assert not frame(wire, worker, cache, ["hv0"]).get("reset")
    bounded = frame(wire, worker, cache, ["hv3", "hv4"])
    assert bounded["reset"] and set(bounded["data"]) == {"hv3", "hv4"} and wire.held(worker) == 2


# --- the worker side --------------------------------------------------------------------------------------
def test_the_held_form_reads_like_the_full_form() -> None:
    cache = FactsCache("wire-read", max_age=60.0)
    fields = dict(cpu_pct=95.0, pcpu_pct=[12.345678, 100.0], cpu_history=[10.0, 85.5, 95.0], history_interval=5.0,
                  memory_free_mib=2048, numa=[{"id": 0, "cpus": "0-1", "memory_mib": 4096}], load_avg=[1.0, 0.5, 0.2])
    assert cache.ingest(message("hv0", 1, **fields))
    assert cache.ingest(message("hv1", 1, age=120.0, **fields))  # older than max_age: stale
    held, worker, wire = HeldFacts(), FakeWorker(), FactsWire()
    for _ in range(2):  # the first call brings the data, the second only refs: both read the same
        with reading(json.loads(json.dumps(full_form(cache, ["hv0", "hv1", "x"])))):
            full = {h: dataclasses.asdict(api.host(h)) for h in ("hv0", "hv1")}
            full_age = {h: api.host(h).age for h in ("hv0", "hv1")}
        with reading(held.for_call(frame(wire, worker, cache, ["hv0", "hv1", "x"]))):
            got = api.hosts()
            assert set(got) == {"hv0", "hv1"} and api.host("x") is None and "x" in api.missing()
            for h, host in got.items():
                seen = dataclasses.asdict(host)
                assert abs(host.age - full_age[h]) < 1.0 and full[h].pop("fixed_age") == full_age[h]
                assert seen.pop("fixed_age") is None  # the held form counts the age from the call's time
                assert seen == full[h] and host.pcpu_pct == (12.345678, 100.0) and host.cpu_above_for(80) == 10.0
            assert not api.host("hv0").stale and api.host("hv1").stale and api.host("hv1").age >= 120
            copy = dataclasses.replace(api.host("hv0"), fixed_age=7.0, memory_free_mib=1)
            assert copy.age == 7.0 and copy.memory_free_mib == 1 and api.host("hv0").memory_free_mib == 2048
            assert repr(api.host("hv0")).startswith("Host(host_id='hv0'")
            kept = api.host("hv0")
    assert copy.age == 7.0 and kept.memory_free_mib == 2048  # a copy keeps the age it was given


def test_a_held_host_ages_and_turns_stale_with_the_calls() -> None:
    cache = FactsCache("wire-age", max_age=0.3)
    fill(cache, 1, ["hv0"], memory_free_mib=7)
    held, worker, wire = HeldFacts(), FakeWorker(), FactsWire()
    with reading(held.for_call(frame(wire, worker, cache, ["hv0"]))):
        first = api.host("hv0")
        assert first is not None and not first.stale and first.age < 0.3
        first_age = first.age
    time.sleep(0.2)
    with reading(held.for_call(frame(wire, worker, cache, ["hv0"]))):  # a later call: the same Host, older
        # both ages are rounded to the millisecond: their difference may read up to 1 ms short
        assert api.host("hv0") is first and first.age >= first_age + 0.2 - 0.001 and not first.stale
    time.sleep(0.2)  # older than max_age now; no new message from its agent
    later = frame(wire, worker, cache, ["hv0"])
    assert "data" not in later and later["same_hosts"] and later["stale"] == ["hv0"]
    with reading(held.for_call(later)):
        again = api.host("hv0")
        assert again.stale and again.age >= 0.4 and again.memory_free_mib == 7
    with reading(held.for_call(frame(wire, worker, cache, ["hv0"]))):
        assert api.host("hv0") is again  # stale until its agent speaks again
    fill(cache, 2, ["hv0"], memory_free_mib=8)  # the agent speaks again: a new Host, fresh
    with reading(held.for_call(frame(wire, worker, cache, ["hv0"]))):
        fresh = api.host("hv0")
        assert fresh is not first and fresh is not again and not fresh.stale and fresh.memory_free_mib == 8


def test_a_worker_that_lacks_what_the_pool_sent_asks_for_everything() -> None:
    cache = FactsCache("wire-lost")
    fill(cache, 1, ["hv0", "hv1"], memory_free_mib=10)
    wire, worker = FactsWire(), FakeWorker()
    frame(wire, worker, cache, ["hv0", "hv1"])  # sent, but never reached this worker's Held
    held = HeldFacts()
    with reading(held.for_call(frame(wire, worker, cache, ["hv0", "hv1"]))):
        assert held.lost  # the reply asks for a resync
        assert api.host("hv0") is None and api.hosts() == {}  # nothing it cannot vouch for
    wire.forget(worker)
    with reading(held.for_call(frame(wire, worker, cache, ["hv0", "hv1"]))):
        assert not held.lost and api.host("hv1").memory_free_mib == 10 and not held.lost
    held.hosts.clear(), held.objs.clear(), held.ready.clear()  # something in the worker drops what it holds
    with reading(held.for_call(frame(wire, worker, cache, ["hv0", "hv1"]))):
        assert not held.lost and api.host("hv1") is None and held.lost and api.missing()["hv1"] == LOST
    held.count -= 1  # a frame it took only partly: its count shows it
    with reading(held.for_call(frame(wire, worker, cache, ["hv0", "hv1"]))):
        assert held.lost and api.hosts() == {} and api.missing()["hv0"] == LOST


# --- through real worker processes ------------------------------------------------------------------------
PROBE = '''
import os
from vmsched.plugin import facts


class Probe:
    def do_filter(self, hosts, vm, args):
        return {"pid": os.getpid(), "seen": {h: [x.memory_free_mib, x.stale, [g.uuid for g in x.guests]]
                                             for h, x in facts.hosts().items()}, "missing": facts.missing()}


class Crash:
    def do_filter(self, hosts, vm, args):
        os._exit(3)


class Forget:
    """Simulates a worker that lost what it held (the pool still believes it holds it)."""
    def do_filter(self, hosts, vm, args):
        import gc
        from vmsched.facts.held import HeldFacts
        for held in [o for o in gc.get_objects() if isinstance(o, HeldFacts)]:  # the worker's own
            held.drop()
        return []
'''


def start_pool(folder: Path, max_calls: int) -> PluginPool:
    (folder / "probe.py").write_text(PROBE)
    pool = PluginPool(folder, size=1, limits=Limits(memory_mb=512), name=f"wire-{uuid.uuid4().hex[:8]}",
                      max_calls=max_calls, confinement=Confinement(allow_root=True))
    pool.start()
    return pool


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[PluginPool]:
    pool = start_pool(tmp_path, max_calls=3)  # recycled after 3 calls
    yield pool
    pool.close()


@pytest.fixture
def lasting_pool(tmp_path: Path) -> Iterator[PluginPool]:
    pool = start_pool(tmp_path, max_calls=1000)
    yield pool
    pool.close()


def probe(pool: PluginPool, cache: FactsCache, hosts: list[str], unit: str = "Probe", **kw: Any) -> Any:
    (result,) = pool.run([Call("probe", unit, "do_filter", (hosts, "", {}), 10.0, cache.prepared(hosts, **kw))])
    if unit != "Probe":
        return result
    assert result.ok, result.error
    return result.value


def expected(cache: FactsCache, hosts: list[str]) -> dict[str, list]:
    return {h: [e.message.host.memory_free_mib, cache.is_stale(e), []] for h in hosts if (e := cache.resolve(h)[0])}


def test_recycled_and_crashed_workers_answer_from_current_facts(pool: PluginPool) -> None:
    cache = FactsCache("wire-pool")
    hosts = [f"hv{i}" for i in range(5)]
    fill(cache, 1, hosts, memory_free_mib=100)
    pids = set()
    for seq in range(2, 9):  # max_calls=3: the worker is recycled twice on the way
        reply = probe(pool, cache, hosts + ["nope"])
        assert reply["seen"] == expected(cache, hosts) and "nope" in reply["missing"], seq
        pids.add(reply["pid"])
        fill(cache, seq, hosts[seq % 5: seq % 5 + 2], memory_free_mib=100 + seq)  # some hosts change
    assert len(pids) >= 3, pids  # recycled workers, each of which got the full facts first
    assert not probe(pool, cache, hosts, unit="Crash").ok
    after_crash = probe(pool, cache, hosts)
    assert after_crash["seen"] == expected(cache, hosts) and after_crash["pid"] not in pids


def test_a_worker_that_lost_its_facts_is_sent_them_again(lasting_pool: PluginPool) -> None:
    cache = FactsCache("wire-pool-lost")
    hosts = [f"hv{i}" for i in range(5)]
    fill(cache, 1, hosts, memory_free_mib=100)
    first = probe(lasting_pool, cache, hosts)
    assert first["seen"] == expected(cache, hosts)
    assert probe(lasting_pool, cache, hosts, unit="Forget").ok
    lost = probe(lasting_pool, cache, hosts)  # the worker says it lacks them: missing this once, then resent
    assert lost["seen"] == {} and lost["pid"] == first["pid"]
    again = probe(lasting_pool, cache, hosts)
    assert again["seen"] == expected(cache, hosts) and again["pid"] == first["pid"]


def test_balance_calls_see_the_current_guest_lists(pool: PluginPool) -> None:
    cache = FactsCache("wire-pool-guests")
    g1, g2 = (GuestFacts(uuid=u, state="running", vcpus=1, memory_mib=512) for u in ("u1", "u2"))
    assert cache.ingest(message("hv0", 1, guests=[g1], memory_free_mib=1))
    assert probe(pool, cache, ["hv0"], with_guests=True)["seen"]["hv0"] == [1, False, ["u1"]]
    assert probe(pool, cache, ["hv0"])["seen"]["hv0"] == [1, False, []]  # a filter call: no guests
    assert cache.ingest(message("hv0", 2, memory_free_mib=2))  # summary only: the list stays
    assert probe(pool, cache, ["hv0"], with_guests=True)["seen"]["hv0"] == [2, False, ["u1"]]
    assert cache.ingest(message("hv0", 3, guests=[g1, g2], memory_free_mib=3))
    assert probe(pool, cache, ["hv0"], with_guests=True)["seen"]["hv0"] == [3, False, ["u1", "u2"]]
