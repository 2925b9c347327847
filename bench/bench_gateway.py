"""Drive the gateway over XML-RPC like the oVirt engine, and print figures.

Each call opens a new HTTP connection (the engine does not keep connections
alive), sends an Apache-style body, reads the reply to EOF and checks it.
Workload: runFilters with 3 filters and runCostFunctions with 3 scores on 100
hosts. Reported: sequential p50/p99 latency and throughput with N concurrent
clients, in embedded mode (memory://) and over RabbitMQ.

    .venv/bin/python bench/bench_gateway.py [--modes embedded,rabbitmq,rabbitmq-classic] [--calls 2000]

``rabbitmq`` uses the request queues of this release (quorum queues with a delivery limit);
``rabbitmq-classic`` makes the gateway publish to the unversioned classic queues of older
releases, which the services still consume (docs/upgrading.md): the cost of the delivery limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import xmlrpc.client
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import floor  # noqa: E402
from tests.engine_wire import call  # noqa: E402

HOSTS = [str(uuid.UUID(int=i + 1)) for i in range(100)]
VM = str(uuid.uuid4())
PLUGINS = '''
import zlib


def _h(s):
    return zlib.crc32(s.encode())


class BenchCpuFilter:
    """Drop hosts whose hash says they are short of CPU."""
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if _h(h) % 10 != 0]


class BenchMemFilter:
    """Drop hosts whose hash says they are short of memory."""
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if _h(h + "m") % 10 != 1]


class BenchLabelFilter:
    """Drop hosts in a deny list property."""
    def do_filter(self, hosts, vm, args):
        deny = set(args.get("deny", "").split(","))
        return [h for h in hosts if h not in deny]


class BenchLoadScore:
    """Score by a pseudo load."""
    def do_score(self, hosts, vm, args):
        return [(h, _h(h) % 100) for h in hosts]


class BenchSpreadScore:
    """Score by a pseudo VM count (float)."""
    def do_score(self, hosts, vm, args):
        return [(h, (_h(h + vm) % 1000) / 10.0) for h in hosts]


class BenchPreferScore:
    """Prefer hosts listed in a property."""
    def do_score(self, hosts, vm, args):
        pref = set(args.get("prefer", "").split(","))
        return [(h, 0 if h in pref else 10) for h in hosts]
'''

FILTER_BODY = call("runFilters", ["BenchCpuFilter", "BenchMemFilter", "BenchLabelFilter"], HOSTS, VM,
                   {"deny": HOSTS[3]})
SCORE_BODY = call("runCostFunctions", [["BenchLoadScore", 1], ["BenchSpreadScore", 2], ["BenchPreferScore", 5]],
                  HOSTS, VM, {"prefer": HOSTS[7]})


def http_request(body: bytes, port: int) -> bytes:
    head = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/xml\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + body


async def one_call(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    data = await reader.read()
    writer.close()
    return data


def check(reply: bytes) -> None:
    """A vmsched reply: HTTP 200 and result code 0 (parsed once per distinct body: floor.verified)."""
    head, _, body = reply.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad reply: {head[:100]!r}")
    floor.verified("vmsched", body, _check_body)


def _check_body(body: bytes) -> None:
    (value,), _ = xmlrpc.client.loads(body)
    if value["result_code"] != 0:
        raise RuntimeError(f"scheduling error: {value}")


async def sequential(port: int, body: bytes, n: int, check: Callable[[bytes], None] = check) -> list[float]:
    payload = http_request(body, port)
    for _ in range(50):  # warm-up
        check(await one_call(port, payload))
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        reply = await one_call(port, payload)
        lat.append(time.perf_counter() - t)
        check(reply)
    return lat


async def concurrent(port: int, bodies: list[bytes], clients: int, seconds: float,
                     check: Callable[[bytes], None] = check) -> tuple[int, float]:
    payloads = [http_request(b, port) for b in bodies]
    done = 0
    stop = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal done
        k = i
        while time.perf_counter() < stop:
            check(await one_call(port, payloads[k % len(payloads)]))
            k += 1
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return done, time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("gateway not ready")


#: A gateway that publishes to the classic (unversioned) request queues, as a gateway of the previous release.
CLASSIC_GATEWAY = ("import sys; from vmsched.bus import topology as t; "
                   "t.REQUEST_QUEUES.update({op: t.legacy_name(q) for op, q in t.REQUEST_QUEUES.items()}); "
                   "from vmsched.cli import main; sys.argv[0] = 'vmsched'; sys.exit(main())")


def start(args: list[str], log: Path, amqp: str | None = None, classic: bool = False) -> subprocess.Popen[bytes]:
    env = {**os.environ, **({"VMSCHED_AMQP_URL": amqp} if amqp else {})}  # the broker password never in argv
    entry = ["-c", CLASSIC_GATEWAY] if classic else ["-m", "vmsched.cli"]
    return subprocess.Popen([sys.executable, *entry, *args], cwd=ROOT, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=env)


def launch(mode: str, plugins: Path, tmp: Path, port: int, amqp: str) -> list[subprocess.Popen[bytes]]:
    common = ["--plugins", str(plugins), "--log-level", "WARNING"]
    if mode == "embedded":
        return [start(["run", "--amqp", "memory://", "--port", str(port), "--metrics-port", "0", *common], tmp / "run.log")]
    return [
        start(["gateway", "--port", str(port), "--metrics-port", "0", "--log-level", "WARNING"], tmp / "gateway.log", amqp,
              classic=mode == "rabbitmq-classic"),
        start(["scoring", *common], tmp / "scoring.log", amqp),
        start(["discovery", *common], tmp / "discovery.log", amqp),
        start(["balancer", *common], tmp / "balancer.log", amqp),
    ]


def pct(lat: list[float], q: float) -> float:
    return sorted(lat)[min(len(lat) - 1, int(len(lat) * q))] * 1000


def arun(coro):  # type: ignore[no-untyped-def]
    """uvloop keeps the load generator's own CPU cost low (it shares the 2 cores)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_mode(mode: str, opts: argparse.Namespace) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix=f"vmsched-bench-{mode}-"))
    plugins = tmp / "plugins"
    plugins.mkdir()
    (plugins / "bench.py").write_text(PLUGINS)
    port = free_port()
    procs = launch(mode, plugins, tmp, port, opts.amqp)
    try:
        wait_ready(port)
        f = arun(sequential(port, FILTER_BODY, opts.calls))
        s = arun(sequential(port, SCORE_BODY, opts.calls))
        rate_f = [_rate(arun(concurrent(port, [FILTER_BODY], opts.clients, opts.seconds))) for _ in range(opts.repeat)]
        rate_m = [_rate(arun(concurrent(port, [FILTER_BODY, SCORE_BODY], opts.clients, opts.seconds)))
                  for _ in range(opts.repeat)]
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(15)
    return {
        "filter_p50": pct(f, 0.50), "filter_p99": pct(f, 0.99), "filter_mean": statistics.mean(f) * 1000,
        "score_p50": pct(s, 0.50), "score_p99": pct(s, 0.99),
        "throughput_filter": statistics.median(rate_f),
        "throughput": statistics.median(rate_m),
        "spread": f"filter {min(rate_f):.0f}-{max(rate_f):.0f}, mix {min(rate_m):.0f}-{max(rate_m):.0f} req/s",
    }


SYSTEMS = ("floor", "embedded", "rabbitmq")


def run_floor(opts: argparse.Namespace) -> None:
    """The floor prototype, embedded vmsched and vmsched on RabbitMQ, started once and measured in interleaved
    rounds (the order rotates each round); ratios are taken within a round, then their median and spread."""
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-floor-"))
    plugins = tmp / "plugins"
    plugins.mkdir()
    (plugins / "bench.py").write_text(PLUGINS)
    ports = {name: free_port() for name in SYSTEMS}
    body = {"floor": call("runFilters", floor.FLOOR_UNITS, HOSTS, VM, {}), "embedded": FILTER_BODY,
            "rabbitmq": FILTER_BODY}
    checks = {"floor": floor.check_floor, "embedded": check, "rabbitmq": check}
    procs: dict[str, list[subprocess.Popen[bytes]]] = {}
    with floor.vhost(opts.amqp, "vmsched-bench-floor") as floor_url, floor.vhost(opts.amqp, "vmsched-bench") as url:
        try:
            procs["floor"] = floor.start_floor(ports["floor"], floor_url, tmp)
            procs["embedded"] = launch("embedded", plugins, tmp, ports["embedded"], url)
            procs["rabbitmq"] = launch("rabbitmq", plugins, tmp, ports["rabbitmq"], url)
            wait_ready(ports["embedded"])
            wait_ready(ports["rabbitmq"])
            fp = http_request(body["floor"], ports["floor"])
            floor.wait_answering(lambda: arun(one_call(ports["floor"], fp)), floor.check_floor)
            time.sleep(3)
            _print_rss("idle, after start", procs)
            print(f"\ncold burst: {opts.clients} clients start at once against the idle install; calls started "
                  "in the first second")
            for name in SYSTEMS:
                payload = http_request(body[name], ports[name])
                lat = arun(floor.cold_burst(lambda: one_call(ports[name], payload), checks[name], opts.clients))
                print(f"  {name:9} {len(lat):4} calls  p50 {pct(lat, .5):7.2f} ms  p90 {pct(lat, .9):7.2f} ms  "
                      f"max {max(lat) * 1000:7.2f} ms  first to finish {lat[0] * 1000:.2f} ms")
            rounds = [_floor_round(r, opts, ports, body, checks) for r in range(opts.rounds)]
            _print_rss("after the rounds", procs)
            if opts.idle_wait > 0:
                time.sleep(opts.idle_wait)
                _print_rss(f"idle again, {opts.idle_wait:.0f} s after the rounds", procs)
        finally:
            for group in procs.values():
                for p in group:
                    os.killpg(p.pid, signal.SIGTERM)
            for group in procs.values():
                for p in group:
                    p.wait(15)
    _print_ratios(rounds)


def _floor_round(r: int, opts: argparse.Namespace, ports: dict[str, int], body: dict[str, bytes],
                 checks: dict[str, Callable[[bytes], None]]) -> dict[str, float]:
    order = SYSTEMS[r % 3:] + SYSTEMS[:r % 3]
    fig: dict[str, float] = {}
    for name in order:
        lat = arun(sequential(ports[name], body[name], opts.calls, checks[name]))
        fig[f"{name}_p50"] = pct(lat, .5)
        fig[f"{name}_p99"] = pct(lat, .99)
        fig[f"{name}_rps"] = _rate(arun(concurrent(ports[name], [body[name]], opts.clients, opts.seconds, checks[name])))
        if name != "floor":
            fig[f"{name}_score_rps"] = _rate(arun(concurrent(ports[name], [SCORE_BODY], opts.clients, opts.seconds)))
    print(f"\nround {r + 1} (order {', '.join(order)})")
    for name in SYSTEMS:
        extra = f"  runCostFunctions {fig[f'{name}_score_rps']:5.0f} req/s" if name != "floor" else ""
        print(f"  {name:9} seq p50 {fig[f'{name}_p50']:6.2f} ms  p99 {fig[f'{name}_p99']:6.2f} ms  "
              f"{opts.clients} clients runFilters {fig[f'{name}_rps']:5.0f} req/s{extra}")
    return fig


def _print_ratios(rounds: list[dict[str, float]]) -> None:
    def show(label: str, values: list[float], target: str) -> None:
        print(f"  {label:44} {statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})  target {target}")

    print(f"\nratios, median of {len(rounds)} interleaved rounds (min-max):")
    for name in ("embedded", "rabbitmq"):
        show(f"{name}: seq p50 / floor's", [f[f"{name}_p50"] / f["floor_p50"] for f in rounds], "<= 1.15x")
        show(f"{name}: 8-client runFilters req/s / floor's", [f[f"{name}_rps"] / f["floor_rps"] for f in rounds],
             ">= 0.85x")
        show(f"{name}: runCostFunctions / runFilters req/s",
             [f[f"{name}_score_rps"] / f[f"{name}_rps"] for f in rounds], ">= 0.80x")
    for key in ("p50", "rps", "score_rps"):
        cols = [f"{name} {statistics.median([f[f'{name}_{key}'] for f in rounds if f'{name}_{key}' in f]):.2f}"
                for name in SYSTEMS if f"{name}_{key}" in rounds[0]]
        print(f"  median {key:9}: " + ", ".join(cols))


def _print_rss(when: str, procs: dict[str, list[subprocess.Popen[bytes]]]) -> None:
    print(f"\nRSS ({when}), MiB:")
    for name, group in procs.items():
        rows = floor.rss_tree([p.pid for p in group])
        print(f"  {name}: {sum(rss for _, _, rss in rows):.0f} MiB in {len(rows)} processes")
        for depth, what, rss in rows:
            print(f"    {'  ' * depth}{what[:70]:72} {rss:6.1f}")


def _rate(result: tuple[int, float]) -> float:
    done, elapsed = result
    return done / elapsed


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the stacks on SIGTERM too (the finally blocks)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="embedded,rabbitmq")
    ap.add_argument("--calls", type=int, default=2000, help="sequential calls per operation")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of one concurrent run")
    ap.add_argument("--repeat", type=int, default=3, help="concurrent runs per mix (the median is reported)")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    ap.add_argument("--floor", action="store_true",
                    help="interleave the floor prototype (../shared/perf-floor), embedded and RabbitMQ (own vhosts)")
    ap.add_argument("--rounds", type=int, default=5, help="--floor: interleaved rounds")
    ap.add_argument("--idle-wait", type=float, default=0.0,
                    help="--floor: after the rounds, wait this long (past --pool-idle, default 60 s) and report RSS "
                         "again: the adaptive plugin pools back at their minimum")
    opts = ap.parse_args()
    if opts.floor:
        run_floor(opts)
        return
    print(f"vmsched gateway benchmark: 3 filters / 3 scores on {len(HOSTS)} hosts, new connection per call, "
          f"{os.cpu_count()} CPUs (load generator included)")
    for mode in opts.modes.split(","):
        r = run_mode(mode, opts)
        print(f"\n[{mode}]")
        print(f"  runFilters       sequential p50 {r['filter_p50']:.2f} ms  p99 {r['filter_p99']:.2f} ms  "
              f"(targets 2.5 / 6 ms: p50 {r['filter_p50'] / 2.5:.2f}x, p99 {r['filter_p99'] / 6:.2f}x of target)")
        print(f"  runCostFunctions sequential p50 {r['score_p50']:.2f} ms  p99 {r['score_p99']:.2f} ms")
        print(f"  {opts.clients} clients, runFilters only:    {r['throughput_filter']:.0f} req/s "
              f"({r['throughput_filter'] / 800:.2f}x the 800 req/s target)")
        print(f"  {opts.clients} clients, filter+score mix: {r['throughput']:.0f} req/s "
              f"({r['throughput'] / 800:.2f}x the 800 req/s target)")
        print(f"  (median of {opts.repeat} runs; {r['spread']})")
        print(f"  vs the old daemon (~32 ms per runFilters, ~124 calls/s): "
              f"{32 / r['filter_p50']:.1f}x faster p50, {r['throughput'] / 124:.1f}x throughput")


if __name__ == "__main__":
    main()
