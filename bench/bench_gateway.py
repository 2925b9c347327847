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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
    head, _, body = reply.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad reply: {head[:100]!r}")
    (value,), _ = xmlrpc.client.loads(body)
    if value["result_code"] != 0:
        raise RuntimeError(f"scheduling error: {value}")


async def sequential(port: int, body: bytes, n: int) -> list[float]:
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


async def concurrent(port: int, bodies: list[bytes], clients: int, seconds: float) -> tuple[int, float]:
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


def _rate(result: tuple[int, float]) -> float:
    done, elapsed = result
    return done / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="embedded,rabbitmq")
    ap.add_argument("--calls", type=int, default=2000, help="sequential calls per operation")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of one concurrent run")
    ap.add_argument("--repeat", type=int, default=3, help="concurrent runs per mix (the median is reported)")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    opts = ap.parse_args()
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
