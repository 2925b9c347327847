"""Host facts: what they cost the cache, the plugin call and the agent.

Every figure is the median of ROUNDS interleaved rounds, printed with the spread (min-max):

- cache ingest: one interval's messages of N hosts (host summaries, the guest list of 20 guests on the
  first round only, as agents send it) into a FactsCache; CPU seconds per interval and % of one core at
  a 5 s interval; memory per host (tracemalloc);
- the plugin call: 3 filters x 100 hosts through a real PluginPool, without facts and with the facts of
  those 100 hosts as the services send them (each worker holds them; a call carries what changed: about one
  host per request here), interleaved; per-request p50 and the service's CPU per request;
- the agent: one collection (host + guests) of 500 guests on libvirt's test driver, CPU time and % of one
  core at a 5 s interval.

    .venv/bin/python bench/bench_facts.py [--rounds 5] [--hosts 1000,5000] [--parts cache,calls,agent]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vmsched.facts.model import FactsMessage, GuestFacts, HostFacts  # noqa: E402
from vmsched.facts.cache import FactsCache  # noqa: E402

INTERVAL = 5.0


def summary(i: int) -> HostFacts:
    return HostFacts(hostname=f"hv{i}", libvirt_uuid=f"{i:032x}", cpus=32, cpu_pct=12.5,
                     pcpu_pct=[float(c % 100) for c in range(32)], load_avg=[1.0, 0.8, 0.5],
                     memory_total_mib=262144, memory_free_mib=131072, memory_available_mib=120000,
                     guests_running=20, guests_total=22, guest_memory_mib=81920, guest_vcpus=60,
                     history_interval=INTERVAL, cpu_history=[float(c % 97) for c in range(120)])


def messages(hosts: int, seq: int, with_guests: bool) -> list[bytes]:
    guests = [GuestFacts(uuid=f"{g:036d}", name=f"vm{g}", state="running", vcpus=4, memory_mib=4096) for g in range(20)]
    return [FactsMessage(host_id=f"hv{i}", instance="bench", seq=seq, time=time.time(), interval=INTERVAL,
                         host=summary(i), guests=guests if with_guests else None).model_dump_json().encode()
            for i in range(hosts)]


def spread(values: list[float], fmt: str = "{:.3g}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def bench_cache(sizes: list[int], rounds: int) -> None:
    print("cache ingest (one interval of every host; median (min-max) of rounds)")
    results: dict[int, list[float]] = {n: [] for n in sizes}
    memory: dict[int, float] = {}
    caches = {n: FactsCache(f"bench{n}") for n in sizes}
    for n in sizes:  # first round: guest lists (not timed), and the memory of the full cache
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for raw in messages(n, 1, True):
            caches[n].ingest(raw)
        gc.collect()
        memory[n] = (tracemalloc.get_traced_memory()[0] - before) / n
        tracemalloc.stop()
    for r in range(rounds):
        for n in sizes:  # interleaved
            batch = messages(n, r + 2, False)
            start = time.process_time()
            for raw in batch:
                caches[n].ingest(raw)
            results[n].append(time.process_time() - start)
    for n in sizes:
        pct = [100 * s / INTERVAL for s in results[n]]
        print(f"  {n:>6} hosts: {spread(results[n])} s CPU per interval = {spread(pct)} % of one core at 5 s; "
              f"{memory[n] / 1024:.1f} KiB per host (with 20 guests)")


FILTER = '''
from vmsched.plugin import facts


class Fresh{n}:
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if facts.host(h) is None or not facts.host(h).stale]
'''


def bench_calls(rounds: int, calls: int) -> None:
    from vmsched.runtime import Call, PluginPool
    from vmsched.runtime.types import Confinement

    folder = Path(tempfile.mkdtemp(prefix="bench-facts-"))
    folder.chmod(0o755)
    for n in range(3):
        (folder / f"fresh{n}.py").write_text(FILTER.format(n=n))
    hosts = [f"hv{i}" for i in range(100)]
    cache = FactsCache("bench-calls")
    for raw in messages(100, 1, False):
        cache.ingest(raw)
    pool = PluginPool(folder, size=3, name="bench", confinement=Confinement(allow_root=True))
    pool.start()
    pool.warm([f"fresh{n}" for n in range(3)])
    modes = ("without", "held")
    p50: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    sent, begun = 100, time.monotonic()
    try:
        for r in range(rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:  # interleaved, order alternating
                times = []
                started = time.process_time()
                for _ in range(calls):
                    while sent * INTERVAL / 100 < time.monotonic() - begun:  # each host every 5 s, as agents send
                        sent += 1
                        message = FactsMessage(host_id=f"hv{sent % 100}", instance="bench", seq=sent, time=time.time(),
                                               interval=INTERVAL, host=summary(sent % 100))
                        cache.ingest(message.model_dump_json().encode())
                    start = time.perf_counter()
                    facts = None if mode == "without" else cache.prepared(hosts)
                    results = pool.run([Call(f"fresh{n}", f"Fresh{n}", "do_filter", (hosts, "", {}), 10.0, facts)
                                        for n in range(3)])
                    times.append(time.perf_counter() - start)
                    assert all(r.ok and len(r.value) == 100 for r in results), results
                cpu[mode].append((time.process_time() - started) / calls)
                p50[mode].append(statistics.median(times))
    finally:
        pool.close()
    print("plugin call: 3 filters x 100 hosts through a PluginPool (per-round p50, median (min-max) of rounds)")
    print(f"  without facts:             {spread([t * 1000 for t in p50['without']])} ms; "
          f"service CPU {spread([t * 1000 for t in cpu['without']])} ms per request")
    for mode, what in (("held", "facts, held by the workers"),):
        ratio = [w / o for w, o in zip(p50[mode], p50["without"])]
        print(f"  {what:<26} {spread([t * 1000 for t in p50[mode]])} ms (ratio {spread(ratio, '{:.2f}')}); "
              f"service CPU {spread([t * 1000 for t in cpu[mode]])} ms per request")


def bench_agent(rounds: int, guests: int) -> None:
    import libvirt

    from vmsched.services.policy_agent.virt.collector import Collector

    domains = "".join(f"<domain type='test'><name>g{i}</name><memory unit='KiB'>65536</memory><vcpu>1</vcpu>"
                      f"<os><type>hvm</type></os></domain>" for i in range(guests))
    node = Path(tempfile.mkdtemp(prefix="bench-facts-")) / "node.xml"
    node.write_text(f"<node><cpu><mhz>2000</mhz><model>i686</model><active>4</active><nodes>1</nodes><sockets>1"
                    f"</sockets><cores>4</cores><threads>1</threads></cpu><memory>8388608</memory>{domains}</node>")
    conn = libvirt.open(f"test://{node}")
    collector = Collector()
    collector.host(conn), collector.guests(conn)
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(rounds):
        t, w = time.process_time(), time.perf_counter()
        collector.host(conn)
        got = collector.guests(conn)
        cpu.append(time.process_time() - t)
        wall.append(time.perf_counter() - w)
        assert len(got) == guests + 0
    collector.close()
    pct = [100 * c / INTERVAL for c in cpu]
    print(f"agent collection, {guests} guests on the test driver (median (min-max) of rounds)")
    print(f"  {spread([c * 1000 for c in cpu])} ms CPU, {spread([w * 1000 for w in wall])} ms wall; "
          f"{spread(pct)} % of one core at 5 s (the test driver answers in-process: real libvirtd adds its RPCs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hosts", default="1000,5000")
    parser.add_argument("--calls", type=int, default=300, help="plugin calls per mode and round")
    parser.add_argument("--guests", type=int, default=500)
    parser.add_argument("--parts", default="cache,calls,agent", help="which of cache, calls, agent to run")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if "cache" in parts:
        bench_cache([int(n) for n in args.hosts.split(",")], args.rounds)
    if "calls" in parts:
        bench_calls(args.rounds, args.calls)
    if "agent" in parts:
        bench_agent(args.rounds, args.guests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
