"""The engine link on the request path: what resolving through it costs a call's facts.

A FactsCache of 100 agents; one request's facts (100 host IDs and a VM) are prepared CALLS times:

- direct: the engine's host IDs are the agents' --host-id, the VM runs on one of the hosts;
- link: the engine's host IDs are mapped by the engine link (the fake engine of tests/support/fake_engine.py over
  HTTPS, answers already cached), the VM is a VM being started (its answer from the link's cache);
- link, cold: how long a new VM's answer takes to appear after the first miss (fake engine on loopback:
  the link's own overhead, not a real engine's latency).

Rounds are interleaved; every figure is the median of ROUNDS rounds with the spread (min-max).

    .venv/bin/python bench/bench_engine_link.py [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.fake_engine import FakeEngine  # noqa: E402
from tests.support.tls_certs import make_certs  # noqa: E402
from vmsched.engine_link import EngineLink  # noqa: E402
from vmsched.engine_link.client import LinkConfig  # noqa: E402
from vmsched.facts.model import FactsMessage, GuestFacts, HostFacts  # noqa: E402
from vmsched.facts.cache import FactsCache  # noqa: E402

HOSTS = 100


def fill(cache: FactsCache, prefix: str) -> None:
    for i in range(HOSTS):
        guests = [GuestFacts(uuid=f"{prefix}-vm{i}", state="running", vcpus=2, memory_mib=2048)]
        cache.ingest(FactsMessage(host_id=f"{prefix}{i}", instance="b", seq=1, time=time.time(), interval=5.0,
                                  host=HostFacts(vdsm_id=f"vdsm-{prefix}{i}", cpus=32, memory_free_mib=65536),
                                  guests=guests).model_dump_json().encode())


def per_call(cache: FactsCache, hosts: list[str], vm: str, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        cache.prepared(hosts, vm)
    return (time.perf_counter() - start) / calls * 1e6


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(Path(tmp))
        engine = FakeEngine(certs).start()
        for i in range(HOSTS):
            engine.add_host(f"E{i}", f"vdsm-hv{i}")
        engine.add_vm("vm-new", 4096, sockets=2, cores=2)
        direct, linked = FactsCache("bench-direct"), FactsCache("bench-link")
        fill(direct, "E")  # agents started with the engine's IDs
        fill(linked, "hv")
        link = EngineLink(LinkConfig(engine.url, engine.username, engine.password), ca=certs.ca, service="bench")
        linked.link = link.start(linked.identities)
        engine_ids = [f"E{i}" for i in range(HOSTS)]
        deadline = time.monotonic() + 60
        while linked.prepared(engine_ids, "vm-new").missing or linked.prepared(engine_ids, "vm-new").vm is None:
            assert time.monotonic() < deadline, "the link did not map the hosts"
            time.sleep(0.05)
        results: dict[str, list[float]] = {"direct": [], "link": [], "cold": []}
        for r in range(args.rounds):
            results["direct"].append(per_call(direct, engine_ids, "E-vm0", args.calls))
            results["link"].append(per_call(linked, engine_ids, "vm-new", args.calls))
            vm = f"vm-cold-{r}"
            engine.add_vm(vm, 1024)
            start = time.perf_counter()
            linked.prepared([], vm)
            while linked.prepared([], vm).vm is None:
                time.sleep(0.0005)
            results["cold"].append((time.perf_counter() - start) * 1e3)
        link.stop()
        engine.stop()
    print(f"facts of {HOSTS} hosts + a VM, microseconds per call, median (min-max) of {args.rounds} rounds:")
    print(f"  direct (--host-id, VM from host facts): {spread(results['direct'])}")
    print(f"  engine link (mapped hosts, VM from the link's cache): {spread(results['link'])}")
    ratio = [b / a for a, b in zip(results["direct"], results["link"])]
    print(f"  link / direct, per round: {spread(ratio)}")
    print(f"first miss -> answer of a new VM (fake engine on loopback), ms: {spread(results['cold'])}")


if __name__ == "__main__":
    main()
