"""CPU per request of every process of the request path, the broker included: the quorum floor against vmsched.

Starts a private RabbitMQ node (its own ports and data: nothing else on the machine loads it, so its CPU is
this bench's alone; ``--broker URL`` uses another one, whose CPU is then not measured), and on it the installs
named by ``--installs``, each on its own vhost:

- ``floor``: the prototype of ``../shared/perf-floor`` (``$VMSCHED_FLOOR_DIR``) with ``PROTO_QUEUE_TYPE=quorum``,
  the queue type vmsched ships: its design-L gateway and its worker with three plugin processes;
- ``rabbitmq``: vmsched's gateway, scoring, discovery and balancer, shipped defaults;
- ``before`` (with ``--before DIR/src``, a ``bench/snapshot.sh`` tree): the same, running that tree's code;
- each ``--variant NAME:VAR=VALUE,...``: the same as ``rabbitmq`` with those settings in its environment (e.g.
  ``nolog:VMSCHED_DECISIONS_SIZE=0``), to see what one setting costs.

In rounds (the order alternates) it drives each: 300 sequential calls (p50), then 8 clients for ``--seconds``:
runFilters on both, and runCostFunctions on vmsched (the floor answers runFilters only). For the concurrent part
it prints the rate and the CPU milliseconds per request of each process tree (from /proc: a process and its
plugin workers, reaped ones included), of the broker and of the load generator (this process). On two cores
shared by all of them, the total is what bounds the rate. At the end: the medians and the targets.

``--rate N`` offers N calls a second (at most 8 at once) instead of as many as 8 clients can make: CPU per
request at the same rate on every install, so that none pays more wake-ups per request for being slower.
``--detail`` adds, per install and round, the packets the broker received and sent per request on each of the
install's connections (``rabbitmqctl list_connections recv_cnt send_cnt``; it waits 6 s before and after for
the broker's statistics) and the CPU per request of each thread of each process.

    VMSCHED_ALLOW_ROOT_PLUGINS=true .venv/bin/python bench/floor_cpu.py [--installs floor,rabbitmq]
        [--rounds 5] [--seconds 5] [--broker URL] [--before DIR/src] [--variant NAME:VAR=VALUE,...]... [--rate N] [--detail]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import floor  # noqa: E402
from bench_gateway import (FILTER_BODY, HOSTS, PLUGINS, SCORE_BODY, VM, arun, call, check, concurrent,  # noqa: E402
                           free_port, http_request, launch, one_call, pct, sequential, wait_ready)


async def paced(port: int, body: bytes, rate: float, seconds: float, ok) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """Calls started ``rate`` times a second for ``seconds`` (at most 8 at once): (calls done, seconds)."""
    payload, slots, done = http_request(body, port), asyncio.Semaphore(8), 0

    async def one() -> None:
        nonlocal done
        try:
            ok(await one_call(port, payload))
            done += 1
        finally:
            slots.release()

    started = time.perf_counter()
    tasks = []
    for k in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, started + k / rate - time.perf_counter()))
        await slots.acquire()
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    return done, time.perf_counter() - started

_HZ = os.sysconf("SC_CLK_TCK")
#: vmsched's processes against the floor's, CPU per request (the issue's targets): (label, vmsched op, part, most).
TARGETS = (
    ("vmsched processes / floor's, runFilters", "filter", "own", 1.3),
    ("broker / floor's broker, runFilters", "filter", "broker", 1.2),
    ("vmsched processes runCostFunctions / floor's runFilters", "score", "own", 1.5),
)


def _seconds(stat: Path, fields: slice) -> float:
    """The sum of ``fields`` (clock ticks) of a /proc stat file, in seconds; 0 once it is gone."""
    try:
        values = stat.read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return sum(map(int, values[fields])) / _HZ


def _cpu(pid: int) -> float:
    """Seconds of CPU of ``pid`` and of its children it has reaped (a recycled plugin worker's stay counted)."""
    return _seconds(Path(f"/proc/{pid}/stat"), slice(11, 15))


def _tree_cpu(root: int) -> float:
    kids, pids = floor._children(), [root]
    for pid in pids:
        pids.extend(kids.get(pid, []))
    return sum(map(_cpu, pids))


def _threads(pid: int) -> dict[str, float]:
    """Seconds of CPU of each thread of ``pid``, by thread ID."""
    return {task.name: _seconds(task / "stat", slice(11, 13)) for task in Path(f"/proc/{pid}/task").glob("*")}


def _packets(bus: Broker, vhost: str) -> dict[str, tuple[int, int]]:
    """Per connection on ``vhost``: the packets the broker has received from it and sent to it."""
    out = bus.ctl("list_connections", "vhost", "name", "recv_cnt", "send_cnt").stdout
    rows = [line.split("\t") for line in (out.decode() if isinstance(out, bytes) else out).splitlines()]
    return {r[1]: (int(r[2]), int(r[3])) for r in rows if len(r) == 4 and r[0] == vhost}


def _start(kind: str, port: int, url: str, tmp: Path, before: Path | None = None,
           env: dict[str, str] | None = None) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    if kind == "floor":
        return floor.start_floor(port, url, tmp, "quorum"), ["worker", "gateway"]
    tree = before if kind == "before" else None
    procs = launch("rabbitmq", tmp / "plugins", tmp, port, url, tree=tree, env=env, tag="-" + kind)
    return procs, ["gateway", "scoring", "discovery", "balancer"]


class Broker:
    """Where the installs' vhosts live, and the process whose CPU is the broker's (None: not measured)."""

    def __init__(self, url_of, pid: int | None, ctl) -> None:  # type: ignore[no-untyped-def]
        self.url_of, self.pid, self.ctl = url_of, pid, ctl

    def vhost(self, name: str) -> str:
        self.ctl("add_vhost", name)
        self.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        return self.url_of(name)


@contextlib.contextmanager
def _broker(url: str | None, tmp: Path):  # type: ignore[no-untyped-def]
    if url:
        yield Broker(lambda vhost: url.rstrip("/") + "/" + vhost, None,
                     lambda *args: subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True,
                                                  timeout=60))
        return
    from tests.support.rabbit_private import PrivateRabbit

    with PrivateRabbit.start_new(tmp / "broker") as node:
        assert node.proc is not None
        yield Broker(lambda vhost: node.url(vhost=vhost), node.proc.pid, node.ctl)  # its process tree: the Erlang VM and its helpers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--installs", default="floor,rabbitmq")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--broker", help="an existing broker's URL (its CPU is then not measured)")
    ap.add_argument("--before", type=Path, help="a bench/snapshot.sh tree (DIR/src) measured beside this one")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE,...",
                    help="this tree again with these environment settings (repeatable)")
    ap.add_argument("--rate", type=float, help="offer this many calls a second instead of 8 clients' most")
    ap.add_argument("--detail", action="store_true", help="packets at the broker and CPU of each thread, per request")
    opts = ap.parse_args()
    variants = {name: dict(pair.split("=", 1) for pair in settings.split(","))
                for name, _, settings in (v.partition(":") for v in opts.variant)}
    kinds = opts.installs.split(",") + (["before"] if opts.before else []) + list(variants)
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-floor-cpu-"))
    (tmp / "plugins").mkdir()
    (tmp / "plugins" / "bench.py").write_text(PLUGINS)
    floor_body = call("runFilters", floor.FLOOR_UNITS, HOSTS, VM, {})
    figures: dict[str, list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        bus = stack.enter_context(_broker(opts.broker, tmp))
        broker = bus.pid
        procs: dict[str, tuple[list[subprocess.Popen[bytes]], list[str]]] = {}
        ports = {kind: free_port() for kind in kinds}

        def stop() -> None:
            for group, _ in procs.values():
                for p in group:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGTERM)
            for group, _ in procs.values():
                for p in group:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(15)

        urls = {kind: bus.vhost(f"floor-cpu-{kind}") for kind in kinds}
        stack.callback(stop)  # runs first: the processes stop before the broker
        for kind in kinds:
            procs[kind] = _start(kind, ports[kind], urls[kind], tmp, opts.before, variants.get(kind))
        for kind in kinds:
            if kind == "floor":
                payload = http_request(floor_body, ports[kind])
                floor.wait_answering(lambda: arun(one_call(ports["floor"], payload)), floor.check_floor)
            else:
                wait_ready(ports[kind])
        me = os.getpid()
        workloads = [(kind, op) for kind in kinds for op in (("filter",) if kind == "floor" else ("filter", "score"))]
        for r in range(opts.rounds):
            for kind, op in workloads if r % 2 == 0 else workloads[::-1]:
                body = floor_body if kind == "floor" else FILTER_BODY if op == "filter" else SCORE_BODY
                ok = floor.check_floor if kind == "floor" else check
                p50 = pct(arun(sequential(ports[kind], body, 300, ok)), 0.5)
                group, names = procs[kind]
                pids = [p.pid for p in group]
                if opts.detail:
                    time.sleep(6)  # the broker's connection statistics are 5 s old at most
                    packets, threads = _packets(bus, f"floor-cpu-{kind}"), [_threads(p) for p in pids]
                before = [_tree_cpu(p) for p in pids] + [_tree_cpu(broker) if broker else 0.0, _cpu(me)]
                load = paced(ports[kind], body, opts.rate, opts.seconds, ok) if opts.rate else \
                    concurrent(ports[kind], [body], 8, opts.seconds, ok)
                done, elapsed = arun(load)
                after = [_tree_cpu(p) for p in pids] + [_tree_cpu(broker) if broker else 0.0, _cpu(me)]
                if opts.detail:
                    _print_detail(bus, f"floor-cpu-{kind}", packets, names, pids, threads, done)
                parts = dict(zip([*names, "broker", "load generator"],
                                 ((b - a) * 1000 / done for a, b in zip(before, after))))
                parts["own"] = sum(v for k, v in parts.items() if k in names)
                parts["rate"], parts["p50"] = done / elapsed, p50
                figures.setdefault(f"{kind} {op}", []).append(parts)
                shown = "  ".join(f"{name} {ms:.2f}" for name, ms in parts.items()
                                  if name not in ("own", "rate", "p50") and ms >= 0.005)
                print(f"round {r + 1} {kind:8s} {op:6s} seq p50 {p50:5.2f} ms  8 clients {done / elapsed:5.0f} req/s  "
                      f"CPU ms/request: own {parts['own']:.2f}, {shown}", flush=True)
                time.sleep(0.5)
    _report(figures)


def _print_detail(bus: Broker, vhost: str, packets: dict[str, tuple[int, int]], names: list[str], pids: list[int],
                  threads: list[dict[str, float]], done: int) -> None:
    for name, pid, before in zip(names, pids, threads):
        ms = [x for x in sorted(((s - before.get(tid, 0.0)) * 1000 / done for tid, s in _threads(pid).items()),
                                reverse=True) if x >= 0.005]
        if ms:
            print(f"    {name} threads, CPU ms/request: {', '.join(f'{x:.3f}' for x in ms)}")
    time.sleep(6)
    now = _packets(bus, vhost)
    moved = sorted(((now[c][0] - p[0]) / done, (now[c][1] - p[1]) / done) for c, p in packets.items() if c in now)
    moved = [m for m in moved if m[0] + m[1] >= 0.01]
    print(f"    packets per request at the broker, received/sent on each connection: "
          f"{', '.join(f'{r:.2f}/{t:.2f}' for r, t in moved)} (total {sum(r + t for r, t in moved):.2f})")


def _report(figures: dict[str, list[dict[str, float]]]) -> None:
    print("\nmedians, CPU ms per request (8 clients):")
    names = sorted({n for rounds in figures.values() for r in rounds for n in r})
    for side, rounds in figures.items():
        med = {n: statistics.median(r.get(n, 0.0) for r in rounds) for n in names}
        print(f"  {side:16s} " + "  ".join(f"{n} {med[n]:.2f}" for n in names if med[n]))
    floor_rounds = figures.get("floor filter")
    if not floor_rounds:
        return
    for tree in [side.split()[0] for side in figures if side.endswith(" filter") and not side.startswith("floor")]:
        name = {"rabbitmq": "this tree", "before": "the before tree"}.get(tree, f"variant {tree}")
        print(f"\ntargets, {name} (median of each round's own ratio, the rounds in brackets):")
        for label, op, part, most in TARGETS:
            ours = figures.get(f"{tree} {op}")
            ratios = [o[part] / f[part] for o, f in zip(ours or [], floor_rounds) if f[part]]
            if not ratios:
                continue
            median = statistics.median(ratios)
            print(f"  {label}: {median:.2f} (at most {most}) {'met' if median <= most else 'MISSED'} "
                  f"[{', '.join(f'{x:.2f}' for x in ratios)}]")


if __name__ == "__main__":
    main()
