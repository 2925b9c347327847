"""Drive the gateway over XML-RPC like the oVirt engine, and print figures.

Each call opens a new HTTP connection (the engine does not keep connections
alive), sends an Apache-style body, reads the reply to EOF and checks it.
Workload: runFilters with 3 filters and runCostFunctions with 3 scores on 100
hosts. Without ``--floor``: sequential p50/p99 latency and throughput with N
concurrent clients, one deployment after the other:

    .venv/bin/python bench/bench_gateway.py [--modes embedded,rabbitmq] [--calls 2000]

``rabbitmq`` uses vmsched's request queues (quorum queues with a delivery limit).

``--floor`` measures, in one run and interleaved rounds, the two floors of ``../shared/perf-floor``
(``floor``: a classic request queue; ``floor-quorum``: ``PROTO_QUEUE_TYPE=quorum``, a broker doing
the same work per request as vmsched's quorum queues) beside vmsched's deployments (``--deployments``),
and prints the speed to hold (:data:`TARGETS`): the embedded all-in-one against the classic floor,
vmsched on RabbitMQ against the quorum floor, runCostFunctions / runFilters on both.

``--record`` adds, per deployment, a side running this tree that records its calls (``VMSCHED_RECORD``, a
temporary folder: ``embedded-record``) and the control (``embedded-again``), and prints the change each makes.
``--shadow`` does the same with a side shadowing every call (``VMSCHED_SHADOW``: the same plugins as the
candidate, ``embedded-shadow``), and prints the share of calls shed, sequential and under load.

``--before DIR/src`` (a ``bench/snapshot.sh`` tree) adds, per deployment, a side running that tree's
code (``embedded-before``) and a second side running this tree (``embedded-again``: the control, whose
difference from ``embedded`` is the noise alone), and prints this tree's change against the before
tree. Use it with ``--mixed``: every side is then served call by call in turn (sequential calls, and
under load each client calls every side in turn; the rate is read as 1 / a client's p50 under that
shared load), so that the machine's moods fall on all sides alike. Blocks of one side after the other
spread too much on a shared machine to resolve a change of a few percent.

    .venv/bin/python bench/bench_gateway.py --floor [--mixed] [--rounds 5] [--calls 500] [--seconds 4]
        [--deployments embedded,rabbitmq] [--before DIR/src] [--record] [--shadow] [--keep]
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
import urllib.request
import uuid
import xmlrpc.client
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import floor  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tests.support.engine_wire import call  # noqa: E402

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
#: the floor's runFilters: its three plugin processes (which return their input)
FLOOR_BODY = call("runFilters", floor.FLOOR_UNITS, HOSTS, VM, {})
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


def start(args: list[str], log: Path, amqp: str | None = None, tree: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """One vmsched process; ``tree``: a ``bench/snapshot.sh`` copy (DIR/src) whose code it runs."""
    env = {**os.environ, **(env or {}), **({"VMSCHED_AMQP_URL": amqp} if amqp else {}),  # the password never in argv
           **({"PYTHONPATH": str(tree)} if tree is not None else {})}
    return subprocess.Popen([sys.executable, "-m", "vmsched.cli", *args], cwd=tree or ROOT, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=env)


def launch(mode: str, plugins: Path, tmp: Path, port: int, amqp: str, tree: Path | None = None,
           env: dict[str, str] | None = None, tag: str = "", metrics_port: int = 0) -> list[subprocess.Popen[bytes]]:
    """``metrics_port``: where the process running the filters and scores serves /metrics (0: any port)."""
    common = ["--plugins", str(plugins), "--log-level", "WARNING"]
    if mode == "embedded":
        return [start(["run", "--amqp", "memory://", "--port", str(port), "--metrics-port", str(metrics_port),
                       *common], tmp / f"run{tag}.log", tree=tree, env=env)]
    scoring = ["--metrics-port", str(metrics_port)] if metrics_port else []
    return [
        start(["gateway", "--port", str(port), "--metrics-port", "0", "--log-level", "WARNING"],
              tmp / f"gateway{tag}.log", amqp, tree=tree, env=env),
        *(start([service, *common, *(scoring if service == "scoring" else [])], tmp / f"{service}{tag}.log", amqp,
                tree=tree, env=env)
          for service in ("scoring", "discovery", "balancer")),
    ]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
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
            p.wait(5)


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
        stop(procs)
    return {
        "filter_p50": pct(f, 0.50), "filter_p99": pct(f, 0.99), "filter_mean": statistics.mean(f) * 1000,
        "score_p50": pct(s, 0.50), "score_p99": pct(s, 0.99),
        "throughput_filter": statistics.median(rate_f),
        "throughput": statistics.median(rate_m),
        "spread": f"filter {min(rate_f):.0f}-{max(rate_f):.0f}, mix {min(rate_m):.0f}-{max(rate_m):.0f} req/s",
    }


# --- --floor: the floors, vmsched and optionally a before tree, in one run -------------------------------------

#: The speed to hold (the lowest throughput ratio, the highest p50 ratio), each deployment against the floor whose
#: broker does the same work per request: the embedded all-in-one against the classic floor, vmsched on RabbitMQ
#: (quorum request queues) against the quorum floor; and runCostFunctions / runFilters throughput on both.
TARGETS = {"embedded": ("floor", 0.95, 1.00), "rabbitmq": ("floor-quorum", 0.80, 1.25)}
SCORE_MIX_TARGET = 0.80
FLOORS = ("floor", "floor-quorum")


@dataclass
class Side:
    """One install measured by ``--floor``: a floor (its queue type), or a vmsched deployment running this tree,
    a before tree (``-before``) or this tree again (``-again``: the control, whose difference from this tree is
    what the machine's noise alone produces)."""

    name: str
    deployment: str  # floor, embedded, rabbitmq
    tree: Path | None = None
    port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # its own environment (--record: VMSCHED_RECORD)
    shadow: bool = False  # --shadow: every call shadowed by the same plugins
    metrics_port: int = 0  # --shadow: where its filters and scores are counted

    def shadow_counts(self) -> dict[str, float]:
        """vmsched_shadow_total by outcome, from the metrics of the process running the filters and scores."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
                if f.name == "vmsched_shadow" for s in f.samples if s.name == "vmsched_shadow_total"}

    @property
    def ops(self) -> tuple[str, ...]:
        return ("filter",) if self.deployment == "floor" else ("filter", "score")

    def body(self, op: str) -> bytes:
        if self.deployment == "floor":
            return FLOOR_BODY
        return FILTER_BODY if op == "filter" else SCORE_BODY

    def payload(self, op: str) -> bytes:
        return http_request(self.body(op), self.port)

    def check(self, reply: bytes) -> None:
        (floor.check_floor if self.deployment == "floor" else check)(reply)


def floor_sides(opts: argparse.Namespace) -> list[Side]:
    sides = [Side(name, "floor") for name in FLOORS]
    for deployment in opts.deployments.split(","):
        sides.append(Side(deployment, deployment))
        if opts.before is not None:
            sides.append(Side(f"{deployment}-before", deployment, opts.before))
        if opts.record:
            folder = Path(tempfile.mkdtemp(prefix=f"vmsched-bench-record-{deployment}-"))
            sides.append(Side(f"{deployment}-record", deployment, env={"VMSCHED_RECORD": str(folder)}))
        if opts.shadow:
            sides.append(Side(f"{deployment}-shadow", deployment, shadow=True))
        if opts.before is not None or opts.record or opts.shadow:
            sides.append(Side(f"{deployment}-again", deployment))
    return sides


def _start_sides(sides: list[Side], urls: dict[str, str], plugins: Path, tmp: Path, env: dict[str, str]) -> None:
    for side in sides:
        side.port = free_port()
        if side.deployment == "floor":
            side.procs = floor.start_floor(side.port, urls[side.name], tmp,
                                           "quorum" if side.name == "floor-quorum" else "classic")
        else:
            shadow = {"VMSCHED_SHADOW": str(plugins), "VMSCHED_SHADOW_RATE": "1"} if side.shadow else {}
            side.metrics_port = free_port() if side.shadow else 0
            side.procs = launch(side.deployment, plugins, tmp, side.port, urls.get(side.name, ""), side.tree,
                                {**env, **side.env, **shadow}, tag=f"-{side.name}", metrics_port=side.metrics_port)
    for side in sides:
        if side.deployment == "floor":
            payload = side.payload("filter")
            floor.wait_answering(lambda: arun(one_call(side.port, payload)), side.check)
        else:
            wait_ready(side.port)


Target = tuple[Side, str]  # a side and one of its operations


async def _mixed_sequential(targets: list[Target], n: int) -> list[list[float]]:
    """``n`` sequential calls to each target, one target after the other in turn (the order rotating): each
    target's latencies, taken in the same seconds as the others'."""
    payloads = [side.payload(op) for side, op in targets]
    for _ in range(50):  # warm-up
        for (side, _op), payload in zip(targets, payloads):
            side.check(await one_call(side.port, payload))
    lat: list[list[float]] = [[] for _ in targets]
    for i in range(n):
        for k in range(len(targets)):
            j = (i + k) % len(targets)
            side = targets[j][0]
            t = time.perf_counter()
            reply = await one_call(side.port, payloads[j])
            lat[j].append(time.perf_counter() - t)
            side.check(reply)
    return lat


async def _mixed_concurrent(targets: list[Target], clients: int, seconds: float) -> list[list[float]]:
    """``clients`` clients, each calling every target in turn: each target's latencies under the same load."""
    payloads = [side.payload(op) for side, op in targets]
    lat: list[list[float]] = [[] for _ in targets]
    stop_at = time.perf_counter() + seconds

    async def client(i: int) -> None:
        k = i
        while time.perf_counter() < stop_at:
            j = k % len(targets)
            side = targets[j][0]
            t = time.perf_counter()
            reply = await one_call(side.port, payloads[j])
            lat[j].append(time.perf_counter() - t)
            side.check(reply)
            k += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return lat


def _measure_mixed(targets: list[Target], opts: argparse.Namespace) -> dict[str, float]:
    """Every target served in the same seconds, call by call, so that the machine's moods fall on all alike. The
    rate under load is read as 1 / a client's p50 (clients that wait longer make fewer calls)."""
    fig: dict[str, float] = {}
    shadows = _Shed(targets)
    for (side, op), lat in zip(targets, arun(_mixed_sequential(targets, opts.calls))):
        fig[f"{side.name} {op} p50"] = pct(lat, .5)
        fig[f"{side.name} {op} p99"] = pct(lat, .99)
    shadows.read(fig, "seq")
    for (side, op), lat in zip(targets, arun(_mixed_concurrent(targets, opts.clients, opts.seconds * len(targets)))):
        fig[f"{side.name} {op} rate"] = 1000 / pct(lat, .5)
    shadows.read(fig, "load")
    return fig


class _Shed:
    """The shadowing sides' share of shed calls in each phase of a round (``--shadow``)."""

    def __init__(self, targets: list[Target]) -> None:
        self.sides = list({side.name: side for side, _ in targets if side.shadow}.values())
        self.last = {side.name: side.shadow_counts() for side in self.sides}

    def read(self, fig: dict[str, float], phase: str) -> None:
        for side in self.sides:
            time.sleep(0.5)  # the shadow's last calls of the phase
            now = side.shadow_counts()
            done = {k: now[k] - self.last[side.name].get(k, 0.0) for k in now}
            fig[f"{side.name} {phase} shed"] = 100 * done.get("shed", 0.0) / max(1.0, sum(done.values()))
            self.last[side.name] = now


def _measure_blocks(targets: list[Target], opts: argparse.Namespace) -> dict[str, float]:
    """Each target in turn: its sequential calls, then its clients' req/s."""
    fig: dict[str, float] = {}
    shadows = _Shed(targets)
    for side, op in targets:
        lat = arun(sequential(side.port, side.body(op), opts.calls, side.check))
        fig[f"{side.name} {op} p50"] = pct(lat, .5)
        fig[f"{side.name} {op} p99"] = pct(lat, .99)
    shadows.read(fig, "seq")
    for side, op in targets:
        done = arun(concurrent(side.port, [side.body(op)], opts.clients, opts.seconds, side.check))
        fig[f"{side.name} {op} rate"] = _rate(done)
    shadows.read(fig, "load")
    return fig


def run_floor(opts: argparse.Namespace) -> None:
    """The floors (classic and quorum request queue), vmsched's deployments and, with ``--before``, each deployment
    running a before tree and this tree a second time (the control), measured in interleaved rounds (the order
    rotates each round; ``--mixed``: call by call); ratios are taken within a round, then their median and
    spread."""
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-floor-"))
    plugins = tmp / "plugins"
    plugins.mkdir()
    (plugins / "bench.py").write_text(PLUGINS)
    env = {"PYTHONHASHSEED": "0"}
    if os.geteuid() == 0:  # as root, plugin workers cannot drop to 'nobody' when Python lives under /root
        env["VMSCHED_ALLOW_ROOT_PLUGINS"] = os.environ.get("VMSCHED_ALLOW_ROOT_PLUGINS", "true")
    sides = floor_sides(opts)
    rounds: list[dict[str, float]] = []
    with ExitStack() as stack:
        urls = {side.name: stack.enter_context(floor.vhost(opts.amqp, f"vmsched-bench-{side.name}"))
                for side in sides if side.deployment in ("floor", "rabbitmq")}
        try:
            for r in range(opts.rounds):
                if r == 0 or not opts.keep:
                    _start_sides(sides, urls, plugins, tmp, env)
                if r == 0:
                    _first_look(sides, opts)
                targets = [(side, op) for side in sides for op in side.ops]
                turn = r % len(targets)
                targets = targets[turn:] + targets[:turn]
                fig = (_measure_mixed if opts.mixed else _measure_blocks)(targets, opts)
                rounds.append(fig)
                _print_round(r, sides, fig, opts)
                if r == opts.rounds - 1 and opts.idle_wait > 0:
                    time.sleep(opts.idle_wait)
                    _print_rss(f"idle again, {opts.idle_wait:.0f} s after the rounds", sides)
                if not opts.keep or r == opts.rounds - 1:
                    if r == opts.rounds - 1:
                        _print_rss("after the rounds", sides)
                    stop([p for side in sides for p in side.procs])
        finally:
            stop([p for side in sides for p in side.procs])
    _report(sides, rounds, opts)


def _first_look(sides: list[Side], opts: argparse.Namespace) -> None:
    time.sleep(3)
    _print_rss("idle, after start", sides)
    print(f"\ncold burst: {opts.clients} clients start at once against the idle install; calls started "
          "in the first second")
    for side in sides:
        payload = side.payload("filter")
        lat = arun(floor.cold_burst(lambda: one_call(side.port, payload), side.check, opts.clients))
        print(f"  {side.name:16} {len(lat):4} calls  p50 {pct(lat, .5):7.2f} ms  p90 {pct(lat, .9):7.2f} ms  "
              f"max {max(lat) * 1000:7.2f} ms  first to finish {lat[0] * 1000:.2f} ms")


def _print_round(r: int, sides: list[Side], fig: dict[str, float], opts: argparse.Namespace) -> None:
    rate = "rate (1/p50 under load)" if opts.mixed else "req/s"
    print(f"\nround {r + 1}" + (" (call by call)" if opts.mixed else ""), flush=True)
    for side in sides:
        cols = [f"{op} seq p50 {fig[f'{side.name} {op} p50']:6.2f} ms p99 {fig[f'{side.name} {op} p99']:6.2f}, "
                f"{opts.clients} clients {fig[f'{side.name} {op} rate']:5.0f}" for op in side.ops]
        print(f"  {side.name:16} " + "; ".join(cols) + f"  ({rate})", flush=True)


def _ratio_line(label: str, values: list[float], target: str = "") -> str:
    med = statistics.median(values)
    return f"  {label:58} {med:.2f}x ({min(values):.2f}-{max(values):.2f}){target}"


def _report(sides: list[Side], rounds: list[dict[str, float]], opts: argparse.Namespace) -> None:
    try:
        load = " (load average %.1f %.1f %.1f at the end)" % os.getloadavg()
    except OSError:
        load = ""
    how = ("served call by call; rate = 1 / a client's p50 under the shared load" if opts.mixed
           else "each install in turn; rate = req/s")
    print(f"\n{len(rounds)} interleaved rounds ({how}); {os.cpu_count()} CPUs, load generator included{load}")
    print("median (min-max) over the rounds:")
    for side in sides:
        for op in side.ops:
            for key, unit in (("p50", "ms"), ("rate", "/s")):
                values = [f[f"{side.name} {op} {key}"] for f in rounds]
                print(f"  {side.name:16} {op:6} {key:4} {statistics.median(values):8.2f} {unit} "
                      f"({min(values):.2f}-{max(values):.2f})")
    print("\nspeed to hold: per-round ratios, median (min-max):")
    names = {side.name for side in sides}
    for deployment, (against, low, high) in TARGETS.items():
        if deployment not in names:
            continue
        for base in FLOORS:
            aim = base == against
            rate = [f[f"{deployment} filter rate"] / f[f"{base} filter rate"] for f in rounds]
            p50 = [f[f"{deployment} filter p50"] / f[f"{base} filter p50"] for f in rounds]
            print(_ratio_line(f"{deployment}: runFilters rate under load / {base}'s", rate,
                              f"  target >= {low:.2f}x: {_met(statistics.median(rate) >= low)}" if aim else ""))
            print(_ratio_line(f"{deployment}: seq p50 / {base}'s", p50,
                              f"  target <= {high:.2f}x: {_met(statistics.median(p50) <= high)}" if aim else ""))
        mix = [f[f"{deployment} score rate"] / f[f"{deployment} filter rate"] for f in rounds]
        print(_ratio_line(f"{deployment}: runCostFunctions / runFilters rate", mix,
                          f"  target >= {SCORE_MIX_TARGET:.2f}x: {_met(statistics.median(mix) >= SCORE_MIX_TARGET)}"))
    if opts.before is not None or opts.record or opts.shadow:
        against = [("before tree", "{d}", "{d}-before")] if opts.before is not None else []
        against += [("recording", "{d}-record", "{d}")] if opts.record else []
        against += [("shadowing", "{d}-shadow", "{d}")] if opts.shadow else []
        print(f"\nthis tree against: {', '.join(a for a, _, _ in against)}; and again against this tree (the "
              "control: the noise), per-round changes, median (spread):")
        for deployment in opts.deployments.split(","):
            pairs = [(o.format(d=deployment), b.format(d=deployment)) for _, o, b in against]
            for other, base in (*pairs, (f"{deployment}-again", deployment)):
                for op in ("filter", "score"):
                    p50 = [100 * (f[f"{other} {op} p50"] / f[f"{base} {op} p50"] - 1) for f in rounds]
                    rate = [100 * (f[f"{other} {op} rate"] / f[f"{base} {op} rate"] - 1) for f in rounds]
                    print(f"  {other:16} vs {base:16} {op:6} seq p50 {statistics.median(p50):+6.1f} % "
                          f"({min(p50):+.1f} .. {max(p50):+.1f}); rate {statistics.median(rate):+6.1f} % "
                          f"({min(rate):+.1f} .. {max(rate):+.1f})")
            if opts.shadow:
                seq, load = ([f[f"{deployment}-shadow {phase} shed"] for f in rounds] for phase in ("seq", "load"))
                print(f"  {deployment}-shadow: calls shed, sequential {statistics.median(seq):.1f} % "
                      f"({min(seq):.1f} .. {max(seq):.1f}); {opts.clients} clients {statistics.median(load):.1f} % "
                      f"({min(load):.1f} .. {max(load):.1f})")


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _print_rss(when: str, sides: list[Side]) -> None:
    print(f"\nRSS ({when}), MiB:")
    for side in sides:
        rows = floor.rss_tree([p.pid for p in side.procs])
        print(f"  {side.name}: {sum(rss for _, _, rss in rows):.0f} MiB in {len(rows)} processes")
        for depth, what, rss in rows:
            print(f"    {'  ' * depth}{what[:70]:72} {rss:6.1f}")


def _rate(result: tuple[int, float]) -> float:
    done, elapsed = result
    return done / elapsed


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the stacks on SIGTERM too (the finally blocks)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="embedded,rabbitmq", help="without --floor: the deployments, one at a time")
    ap.add_argument("--calls", type=int, default=2000, help="sequential calls per operation (and side, and round)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="duration of one concurrent run (--mixed: per side and operation, all served together)")
    ap.add_argument("--repeat", type=int, default=3, help="without --floor: concurrent runs per mix (the median)")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    ap.add_argument("--floor", action="store_true",
                    help="interleave both floor prototypes (../shared/perf-floor, classic and quorum request queue) "
                         "and vmsched's deployments, each on its own vhost")
    ap.add_argument("--deployments", default="embedded,rabbitmq", help="--floor: vmsched's deployments measured")
    ap.add_argument("--before", type=Path,
                    help="--floor: a bench/snapshot.sh tree (DIR/src); each deployment also runs its code, and this "
                         "tree a second time (the control)")
    ap.add_argument("--record", action="store_true",
                    help="--floor: each deployment also runs this tree recording its calls (VMSCHED_RECORD) and this "
                         "tree again without (the control)")
    ap.add_argument("--shadow", action="store_true",
                    help="--floor: each deployment also runs this tree shadowing every call with the same plugins "
                         "(VMSCHED_SHADOW) and this tree again without (the control)")
    ap.add_argument("--mixed", action="store_true",
                    help="--floor: serve every side call by call in turn instead of one after the other")
    ap.add_argument("--keep", action="store_true", help="--floor: start the sides once, not afresh every round")
    ap.add_argument("--rounds", type=int, default=5, help="--floor: interleaved rounds")
    ap.add_argument("--idle-wait", type=float, default=0.0,
                    help="--floor: after the rounds, wait this long (past --pool-idle, default 60 s) and report RSS "
                         "again: the adaptive plugin pools back at their minimum")
    opts = ap.parse_args()
    if opts.before is not None and not (opts.before / "vmsched").is_dir():
        ap.error(f"--before {opts.before}: not a bench/snapshot.sh tree (no vmsched/ in it): give DIR/src")
    if opts.floor:
        run_floor(opts)
        return
    print(f"vmsched gateway benchmark: 3 filters / 3 scores on {len(HOSTS)} hosts, new connection per call, "
          f"{os.cpu_count()} CPUs (load generator included); targets are ratios to the floor: use --floor")
    for mode in opts.modes.split(","):
        r = run_mode(mode, opts)
        print(f"\n[{mode}]")
        print(f"  runFilters       sequential p50 {r['filter_p50']:.2f} ms  p99 {r['filter_p99']:.2f} ms")
        print(f"  runCostFunctions sequential p50 {r['score_p50']:.2f} ms  p99 {r['score_p99']:.2f} ms")
        print(f"  {opts.clients} clients, runFilters only:    {r['throughput_filter']:.0f} req/s")
        print(f"  {opts.clients} clients, filter+score mix: {r['throughput']:.0f} req/s")
        print(f"  (median of {opts.repeat} runs; {r['spread']})")


if __name__ == "__main__":
    main()
