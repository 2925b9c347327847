#!/usr/bin/env python3
"""Host facts collection on the real libvirt QEMU driver: time and CPU per collection.

Run as root (prepares libvirtd with scripts/libvirt-setup.sh, like the e2e tests):

    .venv/bin/python bench/bench_facts_real.py [--guests 2,8] [--rounds 5]

For each guest count it starts that many disk-less TCG guests (1 vCPU, 64 MiB: what
tests/e2e/libvirt/test_facts.py starts) and runs the agent's collector
(``Collector.host`` + ``Collector.guests``: /proc, and one ``getAllDomainStats``
over libvirt's RPC) ``--per-round`` times per round. Per collection: wall time,
this process's CPU, and the CPU libvirtd and the QEMU processes spent answering
(from /proc/PID/stat, 10 ms ticks, so averaged over the round); then the share of
one core at the default 5 s interval. Median (min-max) of the rounds.

Prints figures; asserts nothing. Leaves no guest behind, and stops libvirtd at the
end only if it was not running before.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.libvirt import helpers as h  # noqa: E402
from tests.support import libvirtd  # noqa: E402

INTERVAL = 5.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def measure(conn: object, count: int, rounds: int, per_round: int) -> None:
    from vmsched.services.policy_agent.virt.collector import Collector

    collector = Collector()
    collector.host(conn), collector.guests(conn)  # type: ignore[arg-type]  # the static part, the first rates
    wall: list[float] = []
    own: list[float] = []
    others: list[float] = []
    for _ in range(rounds):
        pids = [p for p in [libvirtd.libvirtd_pid(), *h.qemu_processes().values()] if p]
        w, c, o = time.perf_counter(), time.process_time(), cpu_of(pids)
        for _ in range(per_round):
            collector.host(conn)  # type: ignore[arg-type]
            got = collector.guests(conn)  # type: ignore[arg-type]
        wall.append((time.perf_counter() - w) / per_round)
        own.append((time.process_time() - c) / per_round)
        others.append((cpu_of(pids) - o) / per_round)
        time.sleep(0.2)
    collector.close()
    running = sum(1 for g in got if g.state == "running")
    share = [100 * (a + b) / INTERVAL for a, b in zip(own, others)]
    print(f"  {count} vmsched guests started ({running} running on this libvirtd in all):")
    print(f"    wall {spread([x * 1000 for x in wall])} ms, agent CPU {spread([x * 1000 for x in own])} ms, "
          f"libvirtd + QEMU CPU {spread([x * 1000 for x in others])} ms per collection")
    print(f"    = {spread(share, '{:.3f}')} % of one core at a {INTERVAL:g} s interval (agent + libvirtd + QEMU)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--guests", default="2,8", help="guest counts to measure")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=20, help="collections per round")
    ap.add_argument("--keep-libvirtd", action="store_true", help="do not run libvirt-teardown.sh at the end")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_facts_real: needs root (runs libvirtd); skipped")
        return 0
    owned_session = not (libvirtd.STATE_DIR / "libvirtd.started").exists()
    proc = libvirtd.run_setup(check=False)
    if proc.returncode != 0:
        print(f"bench_facts_real: libvirt-setup.sh failed; cannot run here:\n{proc.stdout}{proc.stderr}")
        return 0
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # a guest not found yet is no error here
    conn = libvirt.open("qemu:///system")
    names: list[str] = []
    try:
        print(f"facts collection on the real QEMU driver ({os.cpu_count()} CPUs; median (min-max) of "
              f"{args.rounds} rounds of {args.per_round} collections)")
        for count in sorted(int(n) for n in args.guests.split(",")):
            while len(names) < count:
                name = f"{h.PREFIX}facts-bench-{len(names)}"
                h.remove_guest(conn, name)
                conn.defineXML(h.guest_xml(name, vcpus=1, memory_mib=64))
                conn.lookupByName(name).create()
                names.append(name)
            time.sleep(1.0)
            measure(conn, count, args.rounds, args.per_round)
    finally:
        h.remove_guests(conn, names)
        conn.close()
        if owned_session and not args.keep_libvirtd:
            libvirtd.run_teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
