"""Pending placements (vmsched/facts/pending.py) and the stock vmsched_Memory filter that counts them.

The burst test drives a real scoring service (its plugin pool in the sandbox,
the stock plugins, its facts cache fed with facts messages) without a bus:
each start is a runFilters then a runCostFunctions call, as the engine makes
them, and the engine's choice is the best-ranked host. The engine link, which
gives the size of a VM being started, is the one part replaced (no engine can
run here): the cache's VM look-up answers the VMs' sizes as the link would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from vmsched.config import Settings, stock_plugins_dir
from vmsched.facts.model import FactsMessage, GuestFacts, HostFacts
from vmsched.messages import Envelope
from vmsched.facts.pending import PendingBook, attach, best_host
from vmsched.facts.wire import PreparedFacts
from vmsched.bus.inprocess import InProcessTransport
from vmsched.services.scoring import ScoringService

A, B = "hv-small", "hv-big"
VM_MIB, RESERVE, OVERHEAD = 2048, 321, 65
FITS = 3  # VMs hv-small has room for


def raw(host: str, seq: int, free_mib: int, guests: list[GuestFacts]) -> bytes:
    return FactsMessage(host_id=host, instance=f"i-{host}", seq=seq, time=time.time(), interval=5.0,
                        host=HostFacts(memory_free_mib=free_mib, guests_running=len(guests)),
                        guests=guests).model_dump_json().encode()


class FakeVms:
    """The cache's VM look-up: the facts' own answer for a running VM, else the size an engine link would give."""

    def __init__(self, cache: Any, sizes: dict[str, int]) -> None:
        self.own, self.sizes = cache.vm, sizes

    def __call__(self, vm: str) -> tuple[dict | None, str | None]:
        view, problem = self.own(vm)
        if view is not None or vm not in self.sizes:
            return view, problem
        return {"id": vm, "memory_mib": self.sizes[vm], "vcpus": 2, "source": "engine"}, None


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScoringService]:
    monkeypatch.delenv("VMSCHED_AMQP_URL", raising=False)
    settings = Settings(plugins_dir=stock_plugins_dir(), allow_root_plugins=True, facts_max_age=300, plugin_timeout=60)
    svc = ScoringService(settings, InProcessTransport(), pool_size=1)
    svc.pool.start()
    svc.catalog.refresh()
    assert svc.catalog.uses_facts("vmsched_memory") and svc.catalog.uses_facts("vmsched_even_guests")
    yield svc
    svc.pool.close()


def call(svc: ScoringService, op: str, body: dict[str, Any]) -> Any:
    env = Envelope(op=op, deadline=time.time() + 30, body=body)
    return svc.filter(env) if op == "filter" else svc.score(env)


def start(svc: ScoringService, vm: str) -> str:
    """One VM start as the engine runs it: filter, rank the kept hosts, take the best one."""
    (kept,) = call(svc, "filter", {"units": ["vmsched_Memory"], "hosts": [A, B], "vm": vm}).outcomes
    assert kept.ok, kept.error
    (ranked,) = call(svc, "score", {"units": [{"name": "vmsched_EvenGuestDistribution"}], "hosts": kept.hosts,
                                    "vm": vm}).outcomes
    pairs = ranked.scores or list(zip(kept.hosts, ranked.values or []))  # the service sends aligned numbers alone
    assert ranked.ok and pairs, (kept, ranked, svc.facts_for([A, B], vm))  # the facts, if none were used
    return min(pairs, key=lambda pair: pair[1])[0]


def test_a_burst_of_starts_does_not_double_book_a_host_that_fits_only_some(service: ScoringService) -> None:
    cache = service.facts
    assert cache is not None
    burst = [str(uuid.UUID(int=i + 1)) for i in range(5)]
    cache.vm = FakeVms(cache, dict.fromkeys(burst, VM_MIB))  # type: ignore[method-assign]
    small_free = RESERVE + FITS * (VM_MIB + OVERHEAD) + 100  # room for FITS VMs, not one more
    big = [GuestFacts(uuid=str(uuid.uuid4()), state="running", memory_mib=512) for _ in range(4)]
    assert cache.ingest(raw(A, 1, small_free, [])) and cache.ingest(raw(B, 1, 64 * 1024, big))

    chosen = [start(service, vm) for vm in burst]  # the facts do not change during the burst
    assert chosen == [A] * FITS + [B] * (len(burst) - FITS)  # the emptier host until it is full, then the other
    assert service.pending.view(cache) == {A: [VM_MIB] * FITS, B: [VM_MIB] * 2}

    # the agent's next facts show the three guests on hv-small: their placements are no longer pending
    arrived = [GuestFacts(uuid=vm, state="running", memory_mib=VM_MIB) for vm in burst[:FITS]]
    assert cache.ingest(raw(A, 2, small_free - FITS * VM_MIB, arrived))
    assert service.pending.view(cache) == {B: [VM_MIB] * 2}


def test_without_pending_placements_the_same_burst_double_books(service: ScoringService) -> None:
    """The control: the same burst with the book emptied before every start lands every VM on hv-small."""
    cache = service.facts
    assert cache is not None
    burst = [str(uuid.UUID(int=i + 100)) for i in range(5)]
    cache.vm = FakeVms(cache, dict.fromkeys(burst, VM_MIB))  # type: ignore[method-assign]
    assert cache.ingest(raw(A, 1, RESERVE + FITS * (VM_MIB + OVERHEAD) + 100, []))
    assert cache.ingest(raw(B, 1, 64 * 1024, [GuestFacts(uuid=str(uuid.uuid4()), state="running")]))
    chosen = []
    for vm in burst:
        service.pending = PendingBook()
        chosen.append(start(service, vm))
    assert chosen == [A] * len(burst)


class Cache:
    def __init__(self, running: dict[str, str] | None = None) -> None:
        self.running = running or {}

    def vm(self, vm: str) -> tuple[dict | None, str | None]:
        on = self.running.get(vm)
        view = {"id": vm, "memory_mib": 1024, "host_id": on, "source": "host facts"} if on else \
            {"id": vm, "memory_mib": 1024, "source": "engine"}
        return view, None


def test_best_host_is_the_unique_lowest_total_with_unscored_hosts_worst() -> None:
    assert best_host(["a", "b", "c"], [(1, [("a", 5), ("b", 3)])]) == "b"  # c unscored: worst (5)
    assert best_host(["a", "b"], [(1, [("a", 1)]), (3, [("a", 2), ("b", 1)])]) == "b"  # a: 1 + 6, b: 1 (worst) + 3
    assert best_host(["a", "b"], [(1, [("a", 1), ("b", 1)])]) is None  # a tie: the engine's units decide
    assert best_host(["a", "b", "c"], [(-1, [("a", 5), ("b", 3)])]) == "a"  # c unscored: worst part (-3), not best
    assert best_host(["a", "b"], []) is None and best_host(["a", "b"], [(1, [])]) is None


def test_a_placement_expires_moves_with_a_migration_and_is_replaced_by_a_new_ranking() -> None:
    book, cache = PendingBook(ttl=60), Cache()
    assert book.placed(cache, "vm1", ["a", "b"], [(1, [("a", 0), ("b", 9)])]) == "a"
    assert book.view(cache) == {"a": [1024]} and book.view(cache, exclude="vm1") == {}
    assert book.placed(cache, "vm1", ["a", "b"], [(1, [("a", 9), ("b", 0)])]) == "b"  # ranked again: replaced
    assert book.view(cache) == {"b": [1024]}
    assert book.view(cache, now=time.time() + 61) == {} and len(book) == 0  # expired
    migrating = Cache({"vm2": "a"})  # runs on a: ranking it best on a records nothing
    assert book.placed(migrating, "vm2", ["a", "b"], [(1, [("a", 0), ("b", 9)])]) is None
    assert book.placed(migrating, "vm2", ["a", "b"], [(1, [("a", 9), ("b", 0)])]) == "b"
    assert book.view(migrating) == {"b": [1024]}  # still on its source: pending on b
    migrating.running["vm2"] = "b"
    assert book.view(migrating) == {}  # arrived


def test_a_ranking_is_not_read_when_the_vms_memory_is_unknown() -> None:
    class NoMemory(Cache):
        def vm(self, vm: str) -> tuple[dict | None, str | None]:
            return None, "unknown VM"

    def ranking():  # the scoring service pairs each unit's numbers with the hosts only when read
        raise AssertionError("the ranking was read for a VM whose memory is unknown")
        yield

    book = PendingBook()
    assert book.placed(NoMemory(), "vm1", ["a", "b"], ranking()) is None and len(book) == 0
    assert book.placed(Cache(), "vm1", ["a", "b"], iter([(1, [("a", 0), ("b", 9)])])) == "a"  # known: read


def test_attach_puts_the_view_in_the_calls_vm_facts() -> None:
    def prepared(vm: dict | None) -> PreparedFacts:
        return PreparedFacts(time.time(), {}, {}, vm, None if vm else "unknown VM")

    found = attach(prepared({"id": "vm1", "memory_mib": 1}), lambda: {"a": [5]})
    assert found.vm["pending"] == {"a": [5]}

    def never() -> dict:
        raise AssertionError("the view is not needed for a VM of unknown size")

    assert attach(prepared(None), never).vm is None and attach(None, never) is None
    assert attach(prepared({"id": "vm1"}), lambda: {"a": [5]}).vm == {"id": "vm1", "pending": {"a": [5]}}
    assert attach(prepared({"id": "vm1"}), dict).vm == {"id": "vm1"}  # nothing pending: the VM's facts unchanged


def test_the_guest_and_memory_weights_count_pending_placements() -> None:
    """In a real plugin worker: a host with VMs placed moments ago weighs as if the facts showed them."""
    from vmsched.runtime import Call, PluginPool
    from vmsched.runtime.contract import KIND
    from vmsched.runtime.types import Confinement

    hosts = {A: {"guests_running": 1, "memory_free_mib": 10000}, B: {"guests_running": 2, "memory_free_mib": 9000}}
    vm = {"id": "vm9", "memory_mib": 1024, "source": "engine"}
    pool = PluginPool(stock_plugins_dir(), size=1, name=f"pending-w-{uuid.uuid4().hex[:6]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    try:
        def weights(unit: tuple[str, str], pending: dict) -> dict[str, float]:
            facts = {"hosts": hosts, "missing": {}, "vm": {**vm, "pending": pending}, "vm_problem": None}
            (result,) = pool.run([Call(*unit, "do_score", KIND["score"].args([A, B], "vm9", {}), 10.0, facts)])
            assert result.ok, result.error
            return dict(result.value)

        guests = ("vmsched_even_guests", "vmsched_EvenGuestDistribution")
        memory = ("vmsched_cpu_memory_weights", "vmsched_MemoryEvenDistribution")
        assert weights(guests, {}) == {A: 1, B: 2} and weights(guests, {A: [2048, 2048]}) == {A: 3, B: 2}
        assert weights(memory, {}) == {A: -10000, B: -9000}
        assert weights(memory, {A: [2048]}) == {A: -7952, B: -9000}
    finally:
        pool.close()
