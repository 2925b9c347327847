"""Where the time of a request goes: the floor prototype and vmsched side by side, under py-spy.

Starts the three installs of ``bench_gateway.py --floor`` (floor, embedded, RabbitMQ), then one at a time
drives 8 clients of runFilters at it while py-spy samples every process of that install (plugin workers
included). Reported per install: CPU milliseconds per request of each process (from /proc, exact) and the
share of the sampled time in each part of the path (the deepest frame that names a part wins).

    .venv/bin/pip install py-spy   # for measuring only: not a vmsched dependency
    .venv/bin/python bench/floor_profile.py [--seconds 15] [--systems floor,embedded,rabbitmq] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import floor  # noqa: E402
from bench_gateway import (FILTER_BODY, HOSTS, PLUGINS, SCORE_BODY, VM, _rate, arun, call, check,  # noqa: E402
                           concurrent, free_port, http_request, launch, one_call, wait_ready)

#: Parts of the path, by a pattern of a frame ("function (file:line)"); checked from the leaf up.
PARTS = [
    ("metrics (prometheus_client)", r"prometheus_client"),
    ("logging", r"\(logging/"),
    ("pydantic models", r"pydantic|model_dump|model_validate"),
    ("JSON", r"\(json/|orjson"),
    ("XML-RPC request parse", r"expat|xmlrpc/client\.py|defusedxml|parse_call|common\.py"),
    ("XML-RPC reply write", r"dump_response|_marshal"),
    ("the engine's decision", r"vmsched/decide/"),
    ("plugin code", r"bench\.py|_plugin_filter"),
    ("plugin worker loop/pipe", r"runtime/worker/|runtime/protocol\.py|facts/held\.py|_plugin_main|"
                                r"multiprocessing/connection"),
    ("service side of the plugin pool", r"runtime/pool/|facts/wire\.py|PluginProc|run_chain"),
    ("decision log", r"gateway/decisions/"),
    ("AMQP client (kombu, py-amqp)", r"kombu/|amqp/|vmsched/bus/|worker\.py"),
    ("HTTP server (uvicorn, httptools)", r"uvicorn/|httptools|h11"),
    ("event loop internals in C (uvloop: socket I/O, epoll)", r"Runner\.run \(asyncio/runners"),
    ("event loop (asyncio, uvloop)", r"asyncio/|uvloop"),
    ("threading", r"threading\.py|concurrent/"),
    ("vmsched (rest)", r"vmsched/|gateway\.py"),
]
_COMPILED = [(name, re.compile(pattern)) for name, pattern in PARTS]
#: Leaf frames blocked in a wait (poll, select, a blocking read, a condition): py-spy does not always see
#: them as idle on a loaded machine. They cost no CPU: the process's CPU is split over the other samples.
def _line_of(path: str, text: str) -> int:
    """The number of the first line of ``path`` (in this repository) that holds ``text``; 0 if none."""
    lines = (Path(__file__).resolve().parents[1] / path).read_text().splitlines()
    return next((n for n, line in enumerate(lines, 1) if text in line), 0)


#: the plugin worker's blocking read of the next request, and the pool's poll of its workers' pipes
_WORKER_READ = _line_of("vmsched/runtime/protocol.py", "header = self._reader.read(HEADER.size)")
_POOL_POLL = _line_of("vmsched/runtime/pool/batch.py", "self._poller.poll(timeout)")
#: a service worker's bus thread waiting for the socket or a finished reply, its handler threads for a request
_BUS_SELECT = _line_of("vmsched/bus/rabbitmq/connection.py", "readable = select.select(")
_BUS_WORK = _line_of("vmsched/bus/rabbitmq/worker.py", "item = self._work.get()")
WAITING = re.compile(rf"protocol\.py:{_WORKER_READ}\)|batch\.py:{_POOL_POLL}\)|connection\.py:{_BUS_SELECT}\)"
                     rf"|rabbitmq/worker\.py:{_BUS_WORK}\)"
                     r"|Condition\.wait|selectors\.py|multiprocessing/connection\.py:378\)")
_FLOOR_WORKER_READ = re.compile(r"amqp/transport\.py:648\)")
#: the blocking reads of the gateway's and services' subscriptions: host facts, the decision log's peer link
_FACTS_DRAIN = _line_of("vmsched/bus/rabbitmq/loop.py", "conn.drain_events(timeout=1.0)")
_BLOCKING_DRAIN = re.compile(rf"serve \(worker\.py|BrokerSubscription\._drain \(vmsched/bus/rabbitmq/loop\.py:{_FACTS_DRAIN}\)")


def part(stack: list[str]) -> str:
    # a blocking read of a whole connection: the floor's worker, vmsched's subscribers
    if WAITING.search(stack[-1]) or (_FLOOR_WORKER_READ.search(stack[-1]) and _BLOCKING_DRAIN.search(";".join(stack))):
        return "(waiting)"
    for frame in reversed(stack):
        for name, pattern in _COMPILED:
            if pattern.search(frame):
                return name
    return "other"


def cpu_ticks(pid: int) -> int | None:
    """utime + stime; None for a process that has ended (an adaptive pool stops idle plugin workers)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except FileNotFoundError:
        return None
    return int(fields[11]) + int(fields[12])


def tree(roots: list[int]) -> list[tuple[int, str]]:
    kids = floor._children()
    out: list[tuple[int, str]] = []

    def walk(pid: int, label: str) -> None:
        out.append((pid, label))
        for i, kid in enumerate(sorted(kids.get(pid, []))):
            walk(kid, f"{label} / child {i + 1}")

    for root in roots:
        try:
            walk(root, floor._describe(root)[0])
        except (OSError, StopIteration):
            pass
    return out


def profile(name: str, port: int, body: bytes, roots: list[int], opts: argparse.Namespace, out: Path) -> None:
    checker = floor.check_floor if name == "floor" else check
    arun(concurrent(port, [body], opts.clients, 2.0, checker))  # warm
    procs = tree(roots)
    tick = os.sysconf("SC_CLK_TCK")
    before = {pid: cpu_ticks(pid) for pid, _ in procs}
    spies = [subprocess.Popen([opts.py_spy, "record", "-p", str(pid), "-f", "raw", "-r", str(opts.rate),
                               "--nonblocking", "-o", str(out / f"{name}-{pid}.txt")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid, _ in procs]
    time.sleep(1.0)
    done, elapsed = arun(concurrent(port, [body], opts.clients, opts.seconds, checker))
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        spy.wait(30)
    for pid, what in tree(roots):  # started during the run (an adaptive pool grows): all their CPU counts
        if pid not in before:
            procs.append((pid, f"{what} (started during the run)"))
            before[pid] = 0
    after = {pid: cpu_ticks(pid) for pid, _ in procs}
    ended = {pid for pid, ticks in after.items() if ticks is None or before[pid] is None}
    cpu = {pid: 0.0 if pid in ended else (after[pid] - before[pid]) / tick for pid, _ in procs}  # type: ignore[operator]
    if ended:
        print(f"  (processes that ended during the run, CPU not counted: {sorted(ended)})")
    print(f"\n[{name}] {done} requests in {elapsed:.1f} s ({_rate((done, elapsed)):.0f} req/s); "
          "CPU ms per request (from /proc; includes the 1 s py-spy start):")
    parts: collections.Counter[str] = collections.Counter()
    for pid, what in procs:
        counts = _read_raw(out / f"{name}-{pid}.txt")
        total = sum(n for key, n in counts.items() if key != "(waiting)") or 1
        if not any(key != "(waiting)" for key in counts):  # not sampled (started during the run, or idle)
            parts["(not sampled: processes started during the run)"] += cpu[pid]
        print(f"  {what[:90]:92} {cpu[pid] * 1000 / done:6.3f}  ({total} samples)")
        for key, n in counts.items():
            if key == "(waiting)":
                continue
            parts[key] += n / total * cpu[pid]  # this process's CPU split by its samples
    print(f"  {'total':62} {sum(cpu.values()) * 1000 / done:6.3f}")
    print("  by part of the path (CPU ms per request):")
    for key, seconds in parts.most_common():
        print(f"    {key:40} {seconds * 1000 / done:6.3f}")
    (out / f"{name}-summary.json").write_text(json.dumps({"requests": done, "seconds": elapsed, "cpu": {
        f"{pid} {what}": cpu[pid] for pid, what in procs}, "parts": dict(parts)}, indent=1))


def _read_raw(path: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[part(stack.split(";"))] += int(n)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="floor,embedded,rabbitmq")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--op", default="runFilters", choices=["runFilters", "runCostFunctions"],
                    help="vmsched's load (the floor always runs its runFilters)")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    ap.add_argument("--out", type=Path, default=None, help="keep the raw py-spy stacks here")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"))
    opts = ap.parse_args()
    out = opts.out or Path(tempfile.mkdtemp(prefix="vmsched-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-profile-run-"))
    (tmp / "plugins").mkdir()
    (tmp / "plugins" / "bench.py").write_text(PLUGINS)
    mine = FILTER_BODY if opts.op == "runFilters" else SCORE_BODY
    body = {"floor": call("runFilters", floor.FLOOR_UNITS, HOSTS, VM, {}), "embedded": mine, "rabbitmq": mine}
    with floor.vhost(opts.amqp, "vmsched-bench-floor") as floor_url, floor.vhost(opts.amqp, "vmsched-bench") as url:
        for name in opts.systems.split(","):
            port = free_port()
            procs = (floor.start_floor(port, floor_url, tmp) if name == "floor"
                     else launch(name, tmp / "plugins", tmp, port, url))
            try:
                if name == "floor":
                    payload = http_request(body[name], port)
                    floor.wait_answering(lambda: arun(one_call(port, payload)), floor.check_floor)
                else:
                    wait_ready(port)
                time.sleep(2)
                profile(name, port, body[name], [p.pid for p in procs], opts, out)
            finally:
                for p in procs:
                    os.killpg(p.pid, signal.SIGTERM)
                for p in procs:
                    p.wait(15)
    print(f"\nraw stacks: {out}")


if __name__ == "__main__":
    main()
