"""CPU per request of every process of the request path, the broker included: the floor against vmsched on RabbitMQ.

Starts the installs named by ``--installs`` (each on its own vhost of the shared broker), then in rounds (the order
alternates) drives each: 300 sequential runFilters calls (p50), then 8 clients for ``--seconds``. For the
concurrent part it prints the rate and the CPU milliseconds per request of each process tree (from /proc: a
process and its plugin workers, reaped ones included), of the whole broker (``beam.smp``) and of the load
generator (this process). On two cores shared by all of them, the total is what bounds the rate.

- ``floor``: the prototype of ``../shared/perf-floor`` (``$VMSCHED_FLOOR_DIR``), as ``bench_gateway.py --floor``;
- ``rabbitmq``: vmsched's gateway, scoring, discovery and balancer, shipped defaults (quorum request queues).

    VMSCHED_ALLOW_ROOT_PLUGINS=true .venv/bin/python bench/floor_cpu.py [--installs floor,rabbitmq]
        [--rounds 4] [--seconds 5] [--amqp URL]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import floor  # noqa: E402
from bench_gateway import (FILTER_BODY, HOSTS, PLUGINS, VM, arun, call, check, concurrent, free_port,  # noqa: E402
                           http_request, launch, one_call, pct, sequential, wait_ready)

_HZ = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """Seconds of CPU of ``pid`` and of its children it has reaped (a recycled plugin worker's stay counted)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return sum(map(int, fields[11:15])) / _HZ


def _tree_cpu(root: int) -> float:
    kids, pids = floor._children(), [root]
    for pid in pids:
        pids.extend(kids.get(pid, []))
    return sum(map(_cpu, pids))


def _broker() -> int:
    found = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True).stdout.split()
    if not found:
        raise SystemExit("no beam.smp (RabbitMQ) process found")
    return int(found[0])


def _start(kind: str, port: int, url: str, tmp: Path) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    if kind == "floor":
        return floor.start_floor(port, url, tmp), ["worker", "gateway"]
    procs = launch("rabbitmq", tmp / "plugins", tmp, port, url)
    return procs, ["gateway", "scoring", "discovery", "balancer"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--installs", default="floor,rabbitmq")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    opts = ap.parse_args()
    kinds = opts.installs.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-floor-cpu-"))
    (tmp / "plugins").mkdir()
    (tmp / "plugins" / "bench.py").write_text(PLUGINS)
    floor_body = call("runFilters", floor.FLOOR_UNITS, HOSTS, VM, {})
    with contextlib.ExitStack() as stack:
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

        urls = {kind: stack.enter_context(floor.vhost(opts.amqp, f"vmsched-floor-cpu-{kind}")) for kind in kinds}
        stack.callback(stop)  # runs first: the processes stop before their vhosts go
        for kind in kinds:
            procs[kind] = _start(kind, ports[kind], urls[kind], tmp)
        for kind in kinds:
            if kind == "floor":
                payload = http_request(floor_body, ports[kind])
                floor.wait_answering(lambda: arun(one_call(ports["floor"], payload)), floor.check_floor)
            else:
                wait_ready(ports[kind])
        broker, me = _broker(), os.getpid()
        for r in range(opts.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                body, ok = (floor_body, floor.check_floor) if kind == "floor" else (FILTER_BODY, check)
                p50 = pct(arun(sequential(ports[kind], body, 300, ok)), 0.5)
                group, names = procs[kind]
                before = [_tree_cpu(p.pid) for p in group] + [_cpu(broker), _cpu(me)]
                done, elapsed = arun(concurrent(ports[kind], [body], 8, opts.seconds, ok))
                after = [_tree_cpu(p.pid) for p in group] + [_cpu(broker), _cpu(me)]
                parts = dict(zip([*names, "broker", "load generator"],
                                 ((b - a) * 1000 / done for a, b in zip(before, after))))
                shown = "  ".join(f"{name} {ms:.2f}" for name, ms in parts.items() if ms >= 0.005)
                print(f"round {r + 1} {kind:9s} seq p50 {p50:5.2f} ms  8 clients {done / elapsed:5.0f} req/s  "
                      f"CPU ms/request: total {sum(parts.values()):.2f} = {shown}", flush=True)
                time.sleep(0.5)


if __name__ == "__main__":
    main()
