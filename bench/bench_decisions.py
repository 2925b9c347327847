"""The cost of the decision log on the engine's request path.

Sides, each its own gateway: ``on`` (the default decision log), ``off``
(VMSCHED_DECISIONS_SIZE=0: no decision log), ``off2``, a second ``off``: the
control, whose "cost" against ``off`` is what the machine's and the
processes' noise alone produce; optional ``local`` (VMSCHED_DECISIONS_SHARE=false)
and ``small`` (a ring of 5 per operation instead of 200: what retention costs).

A round measures every side in turn (the order rotates from round to round):
``--calls`` sequential runFilters (3 filters, 100 hosts, a new connection
per call, like the engine; ``--op score``: runCostFunctions, 3 score units),
reading the side's gateway process CPU time per call from /proc, then
``--clients`` concurrent clients for ``--seconds`` (the rate and the CPU per
call under load: the gateway's, and the whole request path's, which is the
side's process with its plugin workers and, on RabbitMQ, the shared services
with theirs and the broker too, who serve only that side while it runs). Each
round gives a paired ratio per side against ``off``; reported are the median of those ratios over the
rounds and their spread (lowest to highest).

``--mixed`` serves the sides call by call in turn instead (one call to each side, the order rotating; under
load each client calls every side in turn): on a small guest whose speed moves from second to second,
that falls on all sides alike, and the control ``off2`` lands much closer to ``off`` than with the
block-by-block method. The rate is then read as 1 / a client's p50 under the shared load.

Fairness: by default every side's processes are started afresh for every
round (``--keep``: once for the whole run, the old method), so one process's
luck (memory layout, where its heap landed) is not counted as a side's cost
in every round; and all sides run with the same ``PYTHONHASHSEED``
(``--hashseed``, default 0; ``random`` for none). ``--gc`` runs each side
through ``gc_probe.py`` and reports the collector's CPU per call.

``--mode embedded`` (default): each side is an all-in-one ``vmsched run`` on
the embedded bus. ``--mode rabbitmq``: each side is a ``vmsched gateway``
on a private vhost of the RabbitMQ at ``--amqp``, all sharing one set of
services (started once); there ``on`` also links with its peers (presence
on the bus; nothing is published per decision).

    .venv/bin/python bench/bench_decisions.py [--mode embedded|rabbitmq] [--op filter|score] [--rounds 7] [--calls 1000] [--seconds 8]
        [--sides on,off,off2[,small,local,before]] [--gc] [--keep] [--hashseed 0|random] [--before DIR/src] [--mixed]

``before``: the decision log on, running the code of a ``bench/snapshot.sh`` tree (e.g. this tree with an older
decision log), interleaved with the others: a before/after comparison on the same machine at the same time;
``before_off``: that tree with the log off (what ``before`` costs is read against it, as the code around the log
may differ too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_facts_cpu import CpuMeter, rabbitmq_pids  # noqa: E402
from bench_gateway import (FILTER_BODY, PLUGINS, ROOT, SCORE_BODY, arun, check, concurrent, free_port,  # noqa: E402
                           http_request, one_call, pct, sequential, wait_ready)

BODIES = {"filter": FILTER_BODY, "score": SCORE_BODY}

ENV = {"on": {}, "before": {}, "before_off": {"VMSCHED_DECISIONS_SIZE": "0"}, "local": {"VMSCHED_DECISIONS_SHARE": "false"}, "small": {"VMSCHED_DECISIONS_SIZE": "5"},
       "off": {"VMSCHED_DECISIONS_SIZE": "0"},
       "off2": {"VMSCHED_DECISIONS_SIZE": "0"}}  # off2: a second 'off', the control (its 'cost' is the noise)
PROBE = Path(__file__).resolve().parent / "gc_probe.py"


def cpu_seconds(pid: int) -> float:
    """CPU time of one process, its threads summed from /proc/<pid>/task/*/schedstat (nanoseconds; /proc/<pid>/stat
    counts 10 ms ticks); not its children: the plugin workers are the same on every side. A thread that ended
    between two readings is not counted (the gateway's threads live as long as it)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


@dataclass
class Side:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    stats: Path | None  # gc_probe's file

    def gc(self) -> tuple[float, int]:
        """The collector's CPU seconds and full collections so far (0 without --gc)."""
        if self.stats is None:
            return 0.0, 0
        for _ in range(20):
            try:
                data = json.loads(self.stats.read_text())
                return sum(data["seconds"]), data["collections"][2]
            except (OSError, ValueError):
                time.sleep(0.1)
        return 0.0, 0


@dataclass
class Figures:
    p50: list[float] = field(default_factory=list)  # sequential p50, ms
    cpu: list[float] = field(default_factory=list)  # gateway CPU ms per sequential call
    rate: list[float] = field(default_factory=list)  # concurrent req/s
    load_cpu: list[float] = field(default_factory=list)  # gateway CPU ms per call under concurrent load
    path_cpu: list[float] = field(default_factory=list)  # CPU ms per call under load of the whole path
    gc: list[float] = field(default_factory=list)  # collector CPU ms per sequential call
    full: list[int] = field(default_factory=list)  # full (generation 2) collections during the sequential run


def _spread(values: list[float]) -> str:
    return f"{min(values):+.1f} .. {max(values):+.1f} %"


def _start(name: str, args: list[str], log: Path, env: dict[str, str], stats: Path | None,
           tree: Path | None = None) -> subprocess.Popen[bytes]:
    """One side's process; ``tree``: a bench/snapshot.sh copy whose code it runs (the 'before' side)."""
    probe = (tree / "bench" / PROBE.name) if tree is not None else PROBE
    entry = [str(probe), str(stats)] if stats is not None else ["-m", "vmsched.cli"]
    code = {"PYTHONPATH": str(tree)} if tree is not None else {}
    return subprocess.Popen([sys.executable, *entry, *args], cwd=tree or ROOT, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **env, **ENV[name], **code})


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def launch(names: list[str], opts: argparse.Namespace, tmp: Path, env: dict[str, str], url: str) -> dict[str, Side]:
    plugins = ["--plugins", str(tmp / "plugins"), "--log-level", "WARNING"]
    sides = {}
    for name in names:
        port = free_port()
        stats = tmp / f"{name}-{port}.gc.json" if opts.gc else None
        if url:
            args = ["gateway", "--port", str(port), "--metrics-port", "0", "--log-level", "WARNING"]
        else:
            args = ["run", "--amqp", "memory://", "--port", str(port), "--metrics-port", "0", *plugins]
        tree = opts.before if name.startswith("before") else None
        sides[name] = Side(name, port, _start(name, args, tmp / f"{name}.log", env, stats, tree), stats)
    for side in sides.values():
        wait_ready(side.port)
    return sides


def measure(side: Side, opts: argparse.Namespace, figures: Figures) -> None:
    used, (gc_used, full) = cpu_seconds(side.proc.pid), side.gc()
    figures.p50.append(pct(arun(sequential(side.port, BODIES[opts.op], opts.calls)), 0.50))
    calls = opts.calls + 50  # + the warm-up
    figures.cpu.append(1000 * (cpu_seconds(side.proc.pid) - used) / calls)
    if side.stats is not None:
        time.sleep(0.6)  # the probe's next write
    gc_now, full_now = side.gc()
    figures.gc.append(1000 * (gc_now - gc_used) / calls)
    figures.full.append(full_now - full)


def measure_load(side: Side, opts: argparse.Namespace, figures: Figures, shared: list[int]) -> None:
    """The rate under load, the gateway's CPU per call and the whole path's: the side's process and its plugin
    workers, and on RabbitMQ the services (with theirs) and the broker, which serve only this side while it runs
    (bench_facts_cpu.CpuMeter: 10 ms ticks)."""
    path = CpuMeter({"path": [side.proc.pid, *shared]})
    path.start()
    used = cpu_seconds(side.proc.pid)
    done, elapsed = arun(concurrent(side.port, [BODIES[opts.op]], opts.clients, opts.seconds))
    gateway = cpu_seconds(side.proc.pid) - used
    figures.rate.append(done / elapsed)
    figures.load_cpu.append(1000 * gateway / max(done, 1))
    figures.path_cpu.append(1000 * sum(path.stop().values()) / max(done, 1))


async def _mixed_sequential(ports: list[int], body: bytes, n: int) -> list[list[float]]:
    """``n`` sequential calls to each side, one side after the other in turn (the order rotating): each side's
    latencies, taken in the same seconds as the others'."""
    payloads = [http_request(body, port) for port in ports]
    for _ in range(50):  # warm-up
        for port, payload in zip(ports, payloads):
            check(await one_call(port, payload))
    lat: list[list[float]] = [[] for _ in ports]
    for i in range(n):
        for k in range(len(ports)):
            j = (i + k) % len(ports)
            t = time.perf_counter()
            reply = await one_call(ports[j], payloads[j])
            lat[j].append(time.perf_counter() - t)
            check(reply)
    return lat


async def _mixed_concurrent(ports: list[int], body: bytes, clients: int, seconds: float) -> list[list[float]]:
    """``clients`` clients, each calling every side in turn: each side's latencies under the same load."""
    payloads = [http_request(body, port) for port in ports]
    lat: list[list[float]] = [[] for _ in ports]
    stop = time.perf_counter() + seconds

    async def client(i: int) -> None:
        k = i
        while time.perf_counter() < stop:
            j = k % len(ports)
            t = time.perf_counter()
            reply = await one_call(ports[j], payloads[j])
            lat[j].append(time.perf_counter() - t)
            check(reply)
            k += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return lat


def measure_mixed(sides: list[Side], opts: argparse.Namespace, figures: dict[str, Figures]) -> None:
    """--mixed: every side served in the same seconds, call by call, so that the machine's moods (a small guest
    whose speed moves from second to second) fall on all sides alike. Sequential: each side's p50 and
    gateway CPU per call; under load: each side's p50 (the rate's measure: clients that wait longer make fewer
    calls) and its gateway's and path's CPU per call: the side's process with its plugin workers (on RabbitMQ the
    shared services and the broker serve all sides at once: not counted)."""
    ports = [side.port for side in sides]
    used = [cpu_seconds(side.proc.pid) for side in sides]
    collected = [side.gc() for side in sides]
    lat = arun(_mixed_sequential(ports, BODIES[opts.op], opts.calls))
    if opts.gc:
        time.sleep(0.6)  # the probes' next write
    for side, before, (gc_used, full), own in zip(sides, used, collected, lat):
        f = figures[side.name]
        f.p50.append(pct(own, 0.50))
        f.cpu.append(1000 * (cpu_seconds(side.proc.pid) - before) / (opts.calls + 50))
        gc_now, full_now = side.gc()
        f.gc.append(1000 * (gc_now - gc_used) / (opts.calls + 50))
        f.full.append(full_now - full)
    meters = [CpuMeter({"path": [side.proc.pid]}) for side in sides]
    for meter in meters:
        meter.start()
    used = [cpu_seconds(side.proc.pid) for side in sides]
    lat = arun(_mixed_concurrent(ports, BODIES[opts.op], opts.clients, opts.seconds * len(sides)))
    for side, before, own, meter in zip(sides, used, lat, meters):
        f = figures[side.name]
        f.rate.append(1000 / pct(own, 0.50))  # calls per second of one client at its p50 under the load
        f.load_cpu.append(1000 * (cpu_seconds(side.proc.pid) - before) / max(len(own), 1))
        f.path_cpu.append(1000 * sum(meter.stop().values()) / max(len(own), 1))


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the stacks on SIGTERM too (the finally blocks)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000, help="sequential calls per side and round")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of one concurrent run per side and round")
    ap.add_argument("--sides", default="on,off,off2", help="of on, local, small, before, off, off2; 'off' is the baseline")
    ap.add_argument("--mode", choices=["embedded", "rabbitmq"], default="embedded")
    ap.add_argument("--op", choices=sorted(BODIES), default="filter",
                    help="runFilters (3 filters) or runCostFunctions (3 score units), 100 hosts")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/", help="the broker (rabbitmq mode)")
    ap.add_argument("--keep", action="store_true", help="start the sides once, not afresh every round")
    ap.add_argument("--hashseed", default="0", help="PYTHONHASHSEED of every side ('random': none set)")
    ap.add_argument("--gc", action="store_true", help="count the garbage collector's CPU (bench/gc_probe.py)")
    ap.add_argument("--before", type=Path, help="a bench/snapshot.sh tree (DIR/src): side 'before' runs its code")
    ap.add_argument("--mixed", action="store_true",
                    help="serve the sides call by call in turn, not one after the other (measure_mixed); the rate "
                         "is then 1/p50 of a client under load")
    opts = ap.parse_args()
    names = [n for n in opts.sides.split(",") if n in ENV and (not n.startswith("before") or opts.before)]
    if "off" not in names or len(names) < 2:
        ap.error("--sides needs 'off' and at least one other")
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-decisions-"))
    (tmp / "plugins").mkdir()
    (tmp / "plugins" / "bench.py").write_text(PLUGINS)
    env = {} if opts.hashseed == "random" else {"PYTHONHASHSEED": opts.hashseed}
    if os.geteuid() == 0:  # as root, plugin workers cannot drop to 'nobody' when Python lives under /root
        env["VMSCHED_ALLOW_ROOT_PLUGINS"] = "true"
    services: list[subprocess.Popen[bytes]] = []
    vhost = f"vmsched-bench-{uuid.uuid4().hex[:8]}" if opts.mode == "rabbitmq" else ""
    url = ""
    if vhost:
        subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
        subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"], check=True,
                       capture_output=True)
        url = opts.amqp.rstrip("/") + "/" + quote(vhost, safe="")
        env["VMSCHED_AMQP_URL"] = url  # the broker password never in argv
        plugins = ["--plugins", str(tmp / "plugins"), "--log-level", "WARNING"]
        services = [subprocess.Popen([sys.executable, "-m", "vmsched.cli", service, *plugins], cwd=ROOT,
                                     stdout=(tmp / f"{service}.log").open("ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, **env})
                    for service in ("scoring", "discovery")]
    shared = [p.pid for p in services] + (rabbitmq_pids() if vhost else [])  # serve whichever side runs
    figures = {n: Figures() for n in names}
    sides: dict[str, Side] = {}
    try:
        for i in range(opts.rounds):
            if not sides:
                sides = launch(names, opts, tmp, env, url)
            order = names[i % len(names):] + names[:i % len(names)]  # each side first in turn
            if opts.mixed:
                measure_mixed([sides[name] for name in order], opts, figures)
            else:
                for name in order:
                    measure(sides[name], opts, figures[name])
                for name in order:
                    measure_load(sides[name], opts, figures[name], shared)
            print(f"round {i + 1}: " + "; ".join(
                f"{n} p50 {f.p50[-1]:.3f} ms, CPU {f.cpu[-1]:.3f} ms/call (gc {f.gc[-1]:.3f}, {f.full[-1]} full), "
                f"{f.rate[-1]:.0f} req/s ({f.load_cpu[-1]:.3f} CPU ms/call, path {f.path_cpu[-1]:.3f})"
                for n, f in figures.items()), flush=True)
            if not opts.keep:
                _stop([s.proc for s in sides.values()])
                sides = {}
    finally:
        _stop([s.proc for s in sides.values()] + services)
        if vhost:
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)
    report(figures, opts)


def report(figures: dict[str, Figures], opts: argparse.Namespace) -> None:
    try:
        load = " (load average %.1f %.1f %.1f at the end)" % os.getloadavg()
    except OSError:
        load = ""
    how = "the same processes every round" if opts.keep else "fresh processes every round"
    if opts.mixed:
        how += ", the sides served call by call in turn (rate: 1 / a client's p50 under load)"
    what = {"filter": "runFilters", "score": "runCostFunctions"}[opts.op]
    print(f"\n{what} ({opts.mode}), {opts.rounds} interleaved rounds, {how}, PYTHONHASHSEED {opts.hashseed}; "
          f"{os.cpu_count()} CPUs, load generator included{load}:")
    med = statistics.median
    for n, f in figures.items():
        print(f"  {n:5}  sequential p50 {med(f.p50):.3f} ms ({min(f.p50):.3f}-{max(f.p50):.3f}); gateway CPU "
              f"{med(f.cpu):.3f} ms/call ({min(f.cpu):.3f}-{max(f.cpu):.3f}), of it gc {med(f.gc):.3f}, "
              f"{med(f.full)} full collections per run; {opts.clients} clients {med(f.rate):.0f} req/s "
              f"({min(f.rate):.0f}-{max(f.rate):.0f}) at {med(f.load_cpu):.3f} gateway CPU ms/call, "
              f"{med(f.path_cpu):.3f} for the whole path")
    for n, f in figures.items():
        if n in ("off", "before_off"):
            continue
        against = "before_off" if n == "before" and "before_off" in figures else "off"
        base = figures[against]
        rows = {
            "sequential p50": [100 * (a / b - 1) for a, b in zip(f.p50, base.p50)],  # + : the log makes a call slower
            "gateway CPU/call": [100 * (a / b - 1) for a, b in zip(f.cpu, base.cpu)],  # + : the log costs CPU
            f"{opts.clients}-client " + ("p50" if opts.mixed else "rate"):  # + : costs rate (mixed: 1 / p50)
                [100 * (b / a - 1) for a, b in zip(f.rate, base.rate)],
            f"CPU/call, {opts.clients} clients": [100 * (a / b - 1) for a, b in zip(f.load_cpu, base.load_cpu)],
            "path CPU/call": [100 * (a / b - 1) for a, b in zip(f.path_cpu, base.path_cpu)],  # the request path's
        }
        print(f"  cost of '{n}' vs '{against}', median of the per-round ratios (spread):")
        for what, values in rows.items():
            print(f"    {what:20} {med(values):+.1f} %  ({_spread(values)})")
        if opts.gc:
            extra = [1000 * (a - b) for a, b in zip(f.gc, base.gc)]
            print(f"    collector CPU/call   {med(extra):+.1f} us more than '{against}' "
                  f"({min(extra):+.1f} .. {max(extra):+.1f})")


if __name__ == "__main__":
    main()
