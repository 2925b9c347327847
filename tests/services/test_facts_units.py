"""Host facts without a bus: the reader, the cache, the plugin API, the collector and the reporter.

The collector runs against libvirt's test driver and a fake /proc (fixed
counters, so the rates are known); the hung-monitor fallback uses a
connection whose bulk stats call never returns.
"""

from __future__ import annotations

import contextvars
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.facts import full_form, reading
from vmsched.facts.model import FACTS_VERSION, MAX_BYTES, FactsMessage, GuestFacts, HostFacts, Rejected, read
from vmsched.facts.cache import FactsCache
from vmsched.facts.host_map import load_host_map
from vmsched.plugin import facts as api

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/bootstrap --test")

from vmsched.services.policy_agent.facts import arithmetic as calc  # noqa: E402
from vmsched.services.policy_agent.facts.reporter import FactsReporter  # noqa: E402
from vmsched.services.policy_agent.virt.collector import Collector  # noqa: E402


def message(host: str = "hv1", seq: int = 1, instance: str = "i1", guests: list | None = None, **host_fields) -> bytes:
    m = FactsMessage(host_id=host, instance=instance, seq=seq, time=time.time(), interval=5.0,
                     host=HostFacts(**host_fields), guests=guests)
    return m.model_dump_json().encode()


# --- the reader --------------------------------------------------------------------------------------
def test_reader_refuses_what_it_cannot_use() -> None:
    good = json.loads(message())
    assert read(json.dumps(good)).host_id == "hv1"
    assert good["v"] == FACTS_VERSION == 3
    for raw, reason in [(b"{", "malformed"), (b"[]", "malformed"), (json.dumps({**good, "seq": -1}), "malformed"),
                        (json.dumps({**good, "host": {"cpu_pct": float("nan")}}), "malformed"),
                        (json.dumps({**good, "v": 4}), "version"), (json.dumps({**good, "v": 2}), "version"),
                        (b" " * (MAX_BYTES + 1), "oversized")]:
        with pytest.raises(Rejected) as info:
            read(raw)
        assert info.value.reason == reason, raw[:80]


# --- the cache ---------------------------------------------------------------------------------------
def test_cache_order_guest_lists_and_identity() -> None:
    cache = FactsCache("unit", host_map={"engine-guid-1": "hv1"})
    g = GuestFacts(uuid="u1", name="vm1", state="running", vcpus=2, memory_mib=1024)
    assert cache.ingest(message(seq=1, guests=[g], guests_running=1))
    assert not cache.ingest(message(seq=1))  # a replay
    assert not cache.ingest(message(seq=0))  # older
    assert cache.ingest(message(seq=2, guests=None, guests_running=1))  # summary only: the guest list stays
    assert [x.name for x in cache.resolve("hv1")[0].guests] == ["vm1"]
    # the explicit map resolves the engine's ID; an unknown ID has no facts and says why
    payload = full_form(cache, ["engine-guid-1", "nope"], vm="u1")
    assert payload["hosts"]["engine-guid-1"]["agent_host_id"] == "hv1"
    assert "no agent reports host 'nope'" in payload["missing"]["nope"]
    assert payload["vm"] == {"id": "u1", "memory_mib": 1024, "vcpus": 2, "host_id": "hv1", "source": "host facts"}
    assert "no engine link" in cache.vm("unknown-vm")[1]
    # a restarted agent (new instance) starts again at seq 1, and is accepted
    assert cache.ingest(message(seq=1, instance="i2", guests=[]))
    assert cache.resolve("hv1")[0].guests == [] and cache.vm("u1")[0] is None


def test_cache_staleness() -> None:
    cache = FactsCache("unit", max_age=1.0)
    cache.ingest(message())
    entry = cache.resolve("hv1")[0]
    assert not cache.is_stale(entry) and cache.is_stale(entry, now=time.time() + 2)
    default = FactsCache("unit2")  # 3 intervals (5 s each)
    default.ingest(message())
    entry = default.resolve("hv1")[0]
    assert not default.is_stale(entry, now=time.time() + 14) and default.is_stale(entry, now=time.time() + 16)


def test_host_map_file(tmp_path: Path) -> None:
    path = tmp_path / "map"
    path.write_text("# engine = agent\n0a1b-guid = hv1\n\n")
    assert load_host_map(path) == {"0a1b-guid": "hv1"}
    path.write_text("just-a-name\n")
    with pytest.raises(ValueError, match="map:1"):
        load_host_map(path)


# --- the plugin API ----------------------------------------------------------------------------------
def test_plugin_api_history_durations() -> None:
    with reading({"hosts": {"h": {"cpu_history": [90, 10, 85, 95, 99], "history_interval": 5, "cpu_pct": 99,
                                  "guests": [{"uuid": "x", "vcpus": 2}], "field_of_a_newer_service": 1}},
                  "missing": {"z": "no agent"}, "vm": None, "vm_problem": "none given"}):
        h = api.host("h")
        assert h.cpu_above_for(80) == 15.0 and h.cpu_below_for(50) == 0.0 and h.cpu_avg(10) == 97.0
        assert h.guests[0].vcpus == 2 and api.missing() == {"z": "no agent"} and api.vm() is None
        assert api.vm_problem() == "none given" and set(api.hosts()) == {"h"}
    with reading(None):
        assert api.host("h") is None and api.vm_problem() == "no facts were attached to this call"
    assert api.host("h") is None and api.vm_problem() == "no facts were attached to this call"  # outside a call


def test_a_thread_in_a_copy_of_the_units_context_reads_the_calls_facts() -> None:
    seen: list[object] = []
    with reading({"hosts": {"h": {"memory_free_mib": 5}}, "missing": {}, "vm": None, "vm_problem": None}):
        context = contextvars.copy_context()
        worker = threading.Thread(target=context.run, args=(lambda: seen.append(api.host("h")),))
        worker.start()
        worker.join(10)
    assert [getattr(h, "memory_free_mib", None) for h in seen] == [5]


def test_plugin_worker_imports_only_the_standard_library() -> None:
    code = ("import sys; before = set(sys.modules); import vmsched.runtime.worker.main, vmsched.plugin.facts; "
            "print('\\n'.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout.split()
    third_party = set(out) - set(sys.stdlib_module_names) - {"vmsched", "__main__"}
    assert not third_party, third_party


# --- the agent side ----------------------------------------------------------------------------------
STAT1 = "cpu  100 0 100 800 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0\n"
STAT2 = "cpu  400 0 100 1000 0 0 0 0\ncpu0 350 0 50 400 0 0 0 0\ncpu1 50 0 50 600 0 0 0 0\n"
MEMINFO = ("MemTotal: 8388608 kB\nMemFree: 1048576 kB\nMemAvailable: 3145728 kB\nBuffers: 102400 kB\n"
           "Cached: 1048576 kB\nSwapTotal: 2097152 kB\nSwapFree: 1048576 kB\nSReclaimable: 946176 kB\n")


def fake_proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(STAT1)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "loadavg").write_text("0.50 0.25 0.10 1/100 42\n")
    hp = tmp_path / "sys/kernel/mm/hugepages/hugepages-2048kB"
    hp.mkdir(parents=True)
    (hp / "nr_hugepages").write_text("64\n")
    (hp / "free_hugepages").write_text("16\n")
    return proc


def test_collector_host_and_guests(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    vdsm = tmp_path / "vdsm.id"
    vdsm.write_text("hw-1234\n")
    collector = Collector(proc=proc, sys_dir=tmp_path / "sys", vdsm_id=vdsm)
    conn = libvirt.open("test:///default")
    collector.host(conn)
    (proc / "stat").write_text(STAT2)
    host = collector.host(conn)
    assert host.cpu_pct == 60.0 and host.pcpu_pct == [100.0, 0.0]
    assert host.cpus == 16 and (host.sockets, host.cores, host.threads) == (2, 8, 1)  # the capabilities' CPUs
    assert host.memory_total_mib == 8192 and host.memory_free_mib == 3072  # MemFree + Cached + Buffers + SReclaimable
    assert host.memory_available_mib == 3072 and host.swap_used_mib == 1024 and host.load_avg == [0.5, 0.25, 0.1]
    assert [(p.size_kib, p.total, p.free) for p in host.hugepages] == [(2048, 64, 16)]
    assert host.vdsm_id == "hw-1234" and len(host.numa) == 2 and host.numa[0].cpus == "0-7"
    (guest,) = collector.guests(conn)
    assert (guest.name, guest.state, guest.vcpus, guest.memory_mib) == ("test", "running", 2, 2048)
    collector.close()


class HungStats:
    """A connection whose bulk stats call hangs (a guest's QEMU monitor does not answer)."""

    def __init__(self, conn: "libvirt.virConnect") -> None:
        self.conn = conn
        self.release = threading.Event()

    def getAllDomainStats(self, *_):  # noqa: N802 - libvirt's name
        self.release.wait(30)
        return []

    def __getattr__(self, name: str):
        return getattr(self.conn, name)


def test_a_hung_bulk_stats_call_never_stalls_the_collector(tmp_path: Path) -> None:
    hung = HungStats(libvirt.open("test:///default"))
    collector = Collector(proc=fake_proc(tmp_path), sys_dir=tmp_path / "sys", stats_timeout=0.2)
    try:
        for _ in range(2):  # the first times out, the second does not even wait for the hung call
            (guest,) = collector.guests(hung)
            assert guest.name == "test" and guest.memory_mib == 2048  # read one by one instead
        assert collector.fallbacks == 2
    finally:
        hung.release.set()
        collector.close()


def test_reporter_sends_guests_only_when_they_change(tmp_path: Path) -> None:
    conn = libvirt.open("test:///default")
    uuid = conn.lookupByName("test").UUIDString()
    layout = (frozenset({2, 3}), frozenset({0, 1}), {uuid: frozenset({3})}, {uuid: None})
    reporter = FactsReporter("hv1", Collector(proc=fake_proc(tmp_path), sys_dir=tmp_path / "sys"), lambda: conn,
                             lambda: layout, lambda *_: None, interval=5.0, guests_every=3)
    first = reporter.collect()
    assert first.seq == 1 and first.guests is not None and first.guests[0].dedicated and first.guests[0].has_policy
    assert first.host.guests_running == 1 and first.host.guest_memory_mib == 2048 and first.host.dedicated_pool == "2-3"
    assert reporter.collect().guests is None  # nothing changed: the summary only
    conn.lookupByName("test").suspend()
    changed = reporter.collect({"event"})
    assert changed.guests is not None and changed.reason == "event" and changed.host.guests_running == 0
    assert [reporter.collect().guests is None for _ in range(3)] == [True, True, False]  # every 3rd at the latest
    assert reporter.collect({"snapshot"}).guests is not None
    assert len(reporter.history) == 5  # interval collections only (not the event or the snapshot)
    reporter.collector.close()


def test_history_keeps_ten_minutes() -> None:
    history = FactsReporter("hv1", None, lambda: None, lambda: None, lambda *_: None, interval=5.0).history
    for i in range(200):
        history.append(float(i))
    assert len(history) == 120 and history[-1] == 199.0


def test_a_cache_payload_reaches_the_plugin_api_intact() -> None:
    cache = FactsCache("unit")
    cache.ingest(message(cpu_pct=95.0, pcpu_pct=[90.0, 100.0], cpu_history=[10.0, 85.5, 95.0], history_interval=5.0,
                         guests_running=3))
    with reading(json.loads(json.dumps(full_form(cache, ["hv1"])))):  # as the worker gets it
        h = api.host("hv1")
        assert h.pcpu_pct == (90.0, 100.0) and h.cpu_history == (10.0, 85.5, 95.0) and h.cpu_above_for(80) == 10.0
        assert h.guests_running == 3 and not h.stale and api.hosts() == {"hv1": h}
