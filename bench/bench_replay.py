"""How fast ``vmsched replay`` runs recorded calls, against the embedded all-in-one serving them live; and how
many bytes a recorded call takes.

Speed (default): the embedded all-in-one (bench_gateway.py's plugins: 3 filters and 3 scores on 100 hosts)
records with ``--record`` while 8 clients call it like the engine (runFilters and runCostFunctions in turn) for
``--seconds``: its live rate is the calls it answered per second. Then the calls of that round are replayed
through the same plugins folder, as ``vmsched replay`` runs them (vmsched.whatif: a sandboxed pool of one worker
per CPU, as many threads; the pool started once, before the rounds): the replay's rate is the calls replayed per
second. Rounds alternate live and replay; the figure is the median ratio replay / live with its spread.

Bytes (``--facts``): a RabbitMQ stack (gateway, scoring, discovery, balancer) records runFilters calls of 100
hosts whose facts a feeder publishes as agents do (bench_gateway_facts.py: every host every 5 s), at
``--rate`` calls per second for ``--seconds``; the recording's bytes per call, and each kind's share, are
printed, with that recording's replay rate.

    .venv/bin/python bench/bench_replay.py [--rounds 5] [--seconds 10] [--facts [--rate 10]]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_gateway_facts as gf  # noqa: E402
from bench_gateway import (FILTER_BODY, PLUGINS, SCORE_BODY, arun, check, concurrent, free_port, http_request,  # noqa: E402
                           launch, one_call, stop, wait_ready)

from vmsched.config import Settings  # noqa: E402
from vmsched.service import plugin_sandbox  # noqa: E402
from vmsched.whatif.reader import load  # noqa: E402
from vmsched.whatif.replay import Policy, replay  # noqa: E402
from vmsched.whatif.writer import recording_files  # noqa: E402


def policy_of(plugins: Path) -> Policy:
    settings = Settings(plugins_dir=plugins)
    limits, confinement = plugin_sandbox(settings)
    workers = os.cpu_count() or 2
    return Policy(plugins, limits, confinement, workers, settings.timeout_for, "bench-replay").start()


def replay_rate(rec: Path, policy: Policy, since: float) -> tuple[float, int]:
    """Calls replayed per second (the loading of the files apart), and how many."""
    calls = load([rec], since=since).calls
    started = time.perf_counter()
    n = sum(1 for result in replay(calls, policy, threads=os.cpu_count() or 2) if result.comparison.status)
    return n / (time.perf_counter() - started), n


def speed(opts: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-replay-"))
    plugins = tmp / "plugins"
    plugins.mkdir()
    (plugins / "bench.py").write_text(PLUGINS)
    rec = tmp / "rec"
    port = free_port()
    env = {"VMSCHED_RECORD": str(rec), "PYTHONHASHSEED": "0"}
    procs = launch("embedded", plugins, tmp, port, "", env=env)
    policy = policy_of(plugins)
    rows = []
    try:
        wait_ready(port)
        for r in range(opts.rounds):
            since = time.time()
            done, elapsed = arun(concurrent(port, [FILTER_BODY, SCORE_BODY], opts.clients, opts.seconds))
            live = done / elapsed
            time.sleep(1.0)  # the writer writes every 0.25 s
            rate, n = replay_rate(rec, policy, since)
            rows.append((live, rate))
            print(f"round {r + 1}: live {live:6.1f} calls/s ({done} calls, {opts.clients} clients); replay "
                  f"{rate:6.1f} calls/s ({n} calls); replay / live {rate / live:.2f}x", flush=True)
    finally:
        policy.close()
        stop(procs)
    ratios = [rate / live for live, rate in rows]
    print(f"\n{len(rows)} rounds, {os.cpu_count()} CPUs: live {statistics.median(r[0] for r in rows):.1f} calls/s, "
          f"replay {statistics.median(r[1] for r in rows):.1f} calls/s; replay / live {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f}); target >= 0.50x: "
          f"{'met' if statistics.median(ratios) >= 0.5 else 'MISSED'}")


def kinds(rec: Path) -> tuple[Counter[str], Counter[str]]:
    """Per record kind, the records and their uncompressed bytes."""
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for path in recording_files(rec):
        for line in gzip.decompress(path.read_bytes()).splitlines():
            kind = line[6:line.index(b'"', 6)].decode()
            count[kind] += 1
            size[kind] += len(line) + 1
    return count, size


def facts_bytes(opts: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-replay-facts-"))
    stack = gf.Stack("record", True, opts.amqp, tmp)
    rec = tmp / "rec"
    os.environ["VMSCHED_RECORD"] = str(rec)  # the stack's processes record (gateway, scoring, balancer)
    feeder = None
    try:
        stack.start()
        feeder = subprocess.Popen([sys.executable, str(Path(gf.__file__)), "--feed"], cwd=ROOT,
                                  env={**os.environ, "VMSCHED_AMQP_URL": stack.url}, start_new_session=True)
        wait_ready(stack.port)
        gf.wait_for_facts(stack.port, len(gf.HOSTS))
        payload = http_request(gf.FILTER_BODY, stack.port)
        since = time.time()

        async def paced() -> int:
            n, start = 0, time.monotonic()
            while time.monotonic() - start < opts.seconds:
                check(await one_call(stack.port, payload))
                n += 1
                await asyncio.sleep(max(0.0, start + n / opts.rate - time.monotonic()))
            return n

        sent = arun(paced())
        time.sleep(1.0)
    finally:
        os.environ.pop("VMSCHED_RECORD", None)
        if feeder is not None:
            feeder.terminate()
            feeder.wait(10)
        stack.stop()
    files = recording_files(rec)
    on_disk = sum(p.stat().st_size for p in files)
    count, size = kinds(rec)
    calls = count["call"]
    print(f"{sent} runFilters calls of {len(gf.HOSTS)} hosts with facts at {opts.rate:g}/s for {opts.seconds:g} s "
          f"(facts: every host every {gf.INTERVAL:g} s); {calls} recorded in {len(files)} files")
    print(f"  on disk: {on_disk} bytes, {on_disk / calls:.0f} bytes per call (gzip), everything included")
    raw = sum(size.values())
    for kind in ("call", "inputs", "host", "guests", "recording"):
        if count[kind]:
            print(f"  {kind:9} {count[kind]:6} records, {size[kind] / count[kind]:7.0f} bytes each uncompressed, "
                  f"{100 * size[kind] / raw:5.1f} % of {raw} bytes")
    policy = policy_of(stack.tmp / "plugins")
    try:
        rate, n = replay_rate(rec, policy, since)
    finally:
        policy.close()
    print(f"  replayed {n} calls at {rate:.1f} calls/s (facts-reading filters)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0, help="live calls per round (--facts: the recording)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--facts", action="store_true", help="the bytes of a recording with facts, on RabbitMQ")
    ap.add_argument("--rate", type=float, default=10.0, help="--facts: runFilters calls per second")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    opts = ap.parse_args()
    if os.geteuid() == 0:  # as root, plugin workers cannot drop to 'nobody' in a private temporary folder
        os.environ.setdefault("VMSCHED_ALLOW_ROOT_PLUGINS", "true")
    (facts_bytes if opts.facts else speed)(opts)


if __name__ == "__main__":
    main()
