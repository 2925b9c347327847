#!/usr/bin/env python3
"""Benchmark of the vmsched policy agent.

1. Event-to-applied latency: start a guest that has a policy and measure, as
   the agent does (vmsched_agent_event_to_applied_seconds), the time from
   libvirt's STARTED event reaching the agent to the guest's policy verified
   (and repaired where needed) in place; the pins are then checked.
2. Reconcile sweep: N guests (default 500) with policies on the test driver;
   time one sweep when everything is in place (verify only) and one after
   every running guest drifted (verify + repair).

    python bench/bench_agent.py                         # test driver, both parts
    python bench/bench_agent.py --uri qemu:///system --domain-type qemu --guests 0 --starts 20
    python bench/bench_agent.py --json                  # machine-readable output

On a real driver it defines throw-away guests named vmsched-bench-N (no disk,
64 MiB, 2 vCPUs) and removes them at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import libvirt  # noqa: E402

from vmsched import cpuset  # noqa: E402
from vmsched.services.policy_agent.agent import Agent  # noqa: E402
from vmsched.services.policy_agent.virt.connection import ensure_event_loop  # noqa: E402
from tests.support.agent_driver import domain_xml, live_pins  # noqa: E402
from vmsched.metrics import REGISTRY  # noqa: E402

PREFIX = "vmsched-bench-"


def guest_xml(name: str, dtype: str) -> str:
    if dtype == "test":
        return domain_xml(name, 2)
    return (f"<domain type='{dtype}'><name>{name}</name><memory unit='MiB'>64</memory>"
            "<vcpu placement='static'>2</vcpu><os><type arch='x86_64'>hvm</type></os>"
            "<devices><controller type='usb' model='none'/><memballoon model='none'/></devices></domain>")


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cleanup(conn: libvirt.virConnect) -> None:
    for dom in conn.listAllDomains(0):
        if dom.name().startswith(PREFIX):
            if dom.isActive():
                dom.destroy()
            if dom.isPersistent():
                dom.undefine()


def bench_start_latency(conn: libvirt.virConnect, agent: Agent, dtype: str, starts: int) -> dict:
    dom = conn.defineXML(guest_xml(PREFIX + "lat", dtype))
    agent.wait_idle(10)
    agent.set_policy(dom.name(), {"vcpu_pins": {"0": "0", "1": "1"}, "emulator_pin": "0-1"})
    latencies = []
    for _ in range(starts):
        count = sample("vmsched_agent_event_to_applied_seconds_count", event="started")
        total = sample("vmsched_agent_event_to_applied_seconds_sum", event="started")
        dom.create()
        deadline = time.monotonic() + 30
        while sample("vmsched_agent_event_to_applied_seconds_count", event="started") == count:
            if time.monotonic() > deadline:
                raise RuntimeError("no STARTED verification within 30 s")
            time.sleep(0.001)
        latencies.append(sample("vmsched_agent_event_to_applied_seconds_sum", event="started") - total)
        pins = live_pins(dom)
        if pins != {0: "0", 1: "1"}:
            raise RuntimeError(f"policy not in place after STARTED: {pins}")
        dom.destroy()
        agent.wait_idle(10)
    dom.undefine()
    ms = [v * 1000 for v in latencies]
    return {"starts": starts, "p50_ms": statistics.median(ms), "p95_ms": pct(ms, 0.95), "max_ms": max(ms),
            "mean_ms": statistics.fmean(ms)}


def bench_sweep(conn: libvirt.virConnect, agent: Agent, guests: int, rounds: int) -> dict:
    t0 = time.perf_counter()
    doms = []
    for i in range(guests):
        dom = conn.defineXML(guest_xml(f"{PREFIX}{i}", "test"))
        dom.create()
        doms.append(dom)
    agent.wait_idle(60)
    for i, dom in enumerate(doms):
        pool = agent.cpus()["shared"]
        shared = sorted(cpuset.parse(pool))
        policy = {"vcpu_pins": {"0": str(shared[i % len(shared)])}, "weight": 100 + i}
        if i % 3 == 0:
            policy["requires"] = [f"{PREFIX}{i + 1}"] if i + 1 < guests else []
        agent.set_policy(dom.name(), policy)
    agent.wait_idle(60)
    setup = time.perf_counter() - t0
    clean = [agent.reconcile() for _ in range(rounds)]
    assert all(s["repaired"] == 0 and not s["errors"] for s in clean), clean
    drifted = []
    for _ in range(rounds):
        for dom in doms:
            dom.pinVcpu(0, (True,) * agent.enforcer.applier.ncpus)  # every guest drifted
        s = agent.reconcile()
        assert s["repaired"] == guests, s
        drifted.append(s)
    for dom in doms:
        dom.destroy()
        dom.undefine()
    steady = [s["duration"] for s in clean]
    repair = [s["duration"] for s in drifted]
    return {"guests": guests, "rounds": rounds, "setup_s": setup,
            "sweep_in_place_s": {"median": statistics.median(steady), "max": max(steady)},
            "sweep_all_drifted_s": {"median": statistics.median(repair), "max": max(repair)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default="test:///default", help="libvirt URI for the latency part")
    ap.add_argument("--domain-type", default=None, help="domain type of the bench guests (test, qemu, kvm)")
    ap.add_argument("--starts", type=int, default=50, help="guest starts measured for the latency")
    ap.add_argument("--guests", type=int, default=500, help="guests in the sweep (test driver only; 0 to skip)")
    ap.add_argument("--rounds", type=int, default=5, help="sweeps measured per case")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    dtype = args.domain_type or ("test" if args.uri.startswith("test:") else "qemu")
    ensure_event_loop()
    results: dict = {"uri": args.uri}
    conn = libvirt.open(args.uri)
    cleanup(conn)
    with tempfile.TemporaryDirectory(prefix="vab") as state:
        agent = Agent(args.uri, "bench", Path(state), None, reconcile_interval=3600).start()
        try:
            if args.starts:
                results["start_latency"] = bench_start_latency(conn, agent, dtype, args.starts)
            if args.guests and args.uri.startswith("test:"):
                results["sweep"] = bench_sweep(conn, agent, args.guests, args.rounds)
        finally:
            agent.stop()
            cleanup(conn)
            conn.close()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    if "start_latency" in results:
        r = results["start_latency"]
        print(f"STARTED -> policy verified ({args.uri}, {r['starts']} starts): p50 {r['p50_ms']:.2f} ms, "
              f"p95 {r['p95_ms']:.2f} ms, max {r['max_ms']:.2f} ms")
    if "sweep" in results:
        r = results["sweep"]
        print(f"reconcile sweep over {r['guests']} guests (test driver, {r['rounds']} rounds): "
              f"in place median {r['sweep_in_place_s']['median'] * 1000:.0f} ms, "
              f"all drifted median {r['sweep_all_drifted_s']['median'] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
